// export_torchscript of sketched models: the TorchScript forward of SKLinear and SKConv2d (as
// sketch::script_layer writes it) computes what the C++ modules compute, SKLinear's ReLU and
// dropout included (in evaluation, and in training from the same seed).
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "afterburner/sketch/sequential.h"
#include "afterburner/sketch/sklinear.h"
#include "testing.h"

namespace afterburner::models {
namespace {

class ExportSketched : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportSketched, TorchScriptComputesWhatTheModulesCompute) {
  torch::manual_seed(4);
  auto sketched = sketch::sketch_sequential(make_model(GetParam()), sketch::SketchConfig().terms(2).rank(4));
  ASSERT_GT(sketched.report.replaced_count(), 0);
  sketched.model->eval();
  testing::TempDir dir;
  export_torchscript(sketched.model, (dir / "model.pt").string());
  auto loaded = torch::jit::load((dir / "model.pt").string());

  const torch::Tensor x = torch::randn({3, 1, 28, 28});
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = sketched.model->forward(x);
  const torch::Tensor actual = loaded.forward({x}).toTensor();
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-4, 1e-5)) << (actual - expected).abs().max();
  int64_t trainable = 0;
  for (const auto& p : loaded.parameters()) trainable += p.numel();
  EXPECT_EQ(trainable, sketched.report.params_after);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ExportSketched, ::testing::Values("mlp", "cnn"));

TEST(ExportSketchedEpilogue, ReluAndDropoutOfAnSKLinearTravelWithIt) {
  torch::manual_seed(5);
  torch::nn::Sequential model(torch::nn::Flatten(),
                              sketch::SKLinear(sketch::SKLinearOptions(784, 64).rank(4).relu(true).dropout(0.2)),
                              sketch::SKLinear(sketch::SKLinearOptions(64, 10).rank(2).dropout(0.5)));
  model->eval();
  testing::TempDir dir;
  export_torchscript(model, (dir / "model.pt").string());
  auto loaded = torch::jit::load((dir / "model.pt").string());
  const torch::Tensor x = torch::randn({5, 1, 28, 28});
  for (const bool training : {false, true}) {
    model->train(training);
    loaded.train(training);
    torch::manual_seed(6);
    const torch::Tensor expected = model->forward(x);
    torch::manual_seed(6);
    const torch::Tensor actual = loaded.forward({x}).toTensor();
    EXPECT_TRUE(torch::allclose(actual, expected, 1e-4, 1e-5)) << "training " << training;
    EXPECT_TRUE(torch::equal(actual == 0, expected == 0)) << "training " << training;  // the same units dropped
  }
}

}  // namespace
}  // namespace afterburner::models
