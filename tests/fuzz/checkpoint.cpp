// Checkpoints (train/checkpoint.h), loaded into a small model with the fused SGD optimizer,
// as `afterburner train --resume` does.
//
// The seed corpus/checkpoint/valid.pt is a real checkpoint of that model after one step:
//   build-asan/tests/fuzz/fuzz_checkpoint --write-seed=tests/fuzz/corpus/checkpoint/valid.pt
// (libFuzzer ignores flags that start with "--").
#include <torch/torch.h>

#include "afterburner/train/checkpoint.h"
#include "afterburner/train/optim.h"
#include "fuzz.h"

namespace {

using namespace afterburner::train;

struct Run {
  torch::nn::Sequential model{torch::nn::Linear(4, 3), torch::nn::ReLU(), torch::nn::Linear(3, 2)};
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      make_optimizer(OptimizerOptions().fused(true), model->parameters());
  GradScaler scaler;

  CheckpointTarget target() { return {"tiny", model, *optimizer, scaler, {}}; }
};

void write_seed(const std::string& path) {
  torch::manual_seed(0);
  Run run;
  run.model->forward(torch::randn({5, 4})).square().sum().backward();
  run.optimizer->step();
  CheckpointTarget target = run.target();
  target.state = {1, 1, 1, 0.5, -1};
  save_checkpoint(path, target);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  afterburner::fuzz::write_seeds_if_asked(*argc, *argv, "--write-seed=", write_seed);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const afterburner::testing::TempDir dir;
  const std::string path = dir / "checkpoint.pt";
  afterburner::testing::write_file(path, afterburner::fuzz::bytes(data, size));
  Run run;
  afterburner::fuzz::expect_clean_errors([&] { load_checkpoint(path, run.target()); });
  return 0;
}
