// DataParallel on c10d::Reducer, with real processes: two ranks of batch 64 end with the same
// parameters as one process of batch 128, with and without gradient accumulation (no_sync on
// every micro-batch but the last), starting from different weights (rank 0's are broadcast).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <tuple>

#include <fmt/format.h>

#include "afterburner/data/loader.h"
#include "afterburner/dist/data_parallel.h"
#include "afterburner/dist/launch.h"
#include "afterburner/models/zoo.h"
#include "afterburner/train/optim.h"
#include "fixtures.h"
#include "testing.h"

namespace afterburner::dist {
namespace {

constexpr int64_t kSteps = 20, kBatch = 128;

// 8x8 images whose class is their brightest quadrant.
data::DatasetPtr quadrants() {
  auto generator = at::detail::createCPUGenerator(11);
  auto images = torch::rand({4000, 1, 8, 8}, generator);
  auto labels = images.reshape({4000, 2, 4, 2, 4}).sum({2, 4}).reshape({4000, 4}).argmax(1);
  return std::make_shared<data::TensorDataset>(images, labels);
}

struct TrainingRun {
  int64_t accumulate = 1;
  int64_t classes = 4;
  bool flat = false;             // afterburner's flat-buffer SGD: gradients are views the Reducer writes through
  int64_t steps = kSteps;
  int64_t kill_at_step = -1;     // this rank kills itself with SIGKILL there, as `kill -9` would
};

// Plain SGD at lr 0.1 over this rank's shard; `group` (if any) averages the gradients over the ranks.
std::vector<torch::Tensor> train(const data::Shard& shard, const TrainingRun& run, const Group* group) {
  torch::manual_seed(shard.rank() + 1);  // different starts: DataParallel must broadcast rank 0's
  auto model = models::make_model("mlp", models::ModelOptions().image_size(8).num_classes(run.classes));
  std::unique_ptr<DataParallel> parallel;
  if (group) parallel = std::make_unique<DataParallel>(model, *group);
  auto sgd = train::make_optimizer(train::OptimizerOptions().lr(0.1).momentum(0).weight_decay(0).fused(run.flat),
                                   model->parameters());
  const int64_t micro_batch = kBatch / shard.count() / run.accumulate;
  data::Loader loader(quadrants(), data::LoaderOptions().batch_size(micro_batch).workers(0).seed(5).shard(shard));
  int64_t micro = 0, steps = 0;
  for (int64_t epoch = 0; steps < run.steps; ++epoch) {
    for (auto& batch : loader.epoch(epoch)) {
      if (steps == run.kill_at_step) std::raise(SIGKILL);
      const bool last_micro_batch = ++micro % run.accumulate == 0;
      if (parallel) parallel->before_forward(/*synchronised=*/last_micro_batch);
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.input), batch.target) / double(run.accumulate);
      if (parallel && last_micro_batch) parallel->before_backward();
      loss.backward();
      if (!last_micro_batch) continue;
      sgd->step();
      sgd->zero_grad();
      if (++steps == run.steps) break;
    }
  }
  std::vector<torch::Tensor> parameters;
  for (const auto& p : model->parameters()) parameters.push_back(p.detach().clone());
  return parameters;
}

std::string variable(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

// The body of one rank, run by the parent test in a process of its own.
TEST(DataParallelRank, Trains) {
  if (std::getenv("AFTERBURNER_TEST_RANK") == nullptr) GTEST_SKIP() << "a rank of DataParallel's tests, started by them";
  auto group = join_group(GroupOptions()
                              .master_port(std::stoi(variable("AFTERBURNER_TEST_PORT", "")))
                              .rank(std::stoi(variable("AFTERBURNER_TEST_RANK", "")))
                              .world_size(2)
                              .timeout(std::chrono::seconds(std::stoi(variable("AFTERBURNER_TEST_TIMEOUT", "30")))));
  auto shard = data::Shard().rank(group.rank).count(2);
  TrainingRun run;
  run.accumulate = std::stoi(variable("AFTERBURNER_TEST_ACCUMULATE", "1"));
  run.classes = std::stoi(variable("AFTERBURNER_TEST_CLASSES", "4"));
  run.flat = variable("AFTERBURNER_TEST_FLAT", "0") == "1";
  run.steps = std::stoi(variable("AFTERBURNER_TEST_STEPS", std::to_string(kSteps).c_str()));
  run.kill_at_step = std::stoi(variable("AFTERBURNER_TEST_KILL_AT_STEP", "-1"));
  auto parameters = train(shard, run, &group);
  torch::save(parameters, variable("AFTERBURNER_TEST_OUTPUT", ""));
}

// (accumulation, flat optimizer)
class TwoRanks : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(TwoRanks, EndAsOneProcessOfTheirTotalBatch) {
  const auto [accumulate, flat] = GetParam();
  testing::TempDir dir;
  auto results = run_ranks("DataParallelRank.Trains", [&](int rank) {
    return std::vector<std::string>{fmt::format("AFTERBURNER_TEST_ACCUMULATE={}", accumulate),
                                    fmt::format("AFTERBURNER_TEST_FLAT={}", flat ? 1 : 0),
                                    fmt::format("AFTERBURNER_TEST_OUTPUT={}", (dir / fmt::format("rank{}.pt", rank)).string())};
  });
  for (const auto& result : results) ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  // One process, batch 128 made of micro-batches of the ranks' size: one process alone already
  // ends 2e-6 apart after one step with micro-batches of 32 instead of 64 (the order of sums in
  // LibTorch's kernels), which 20 steps grow past 1e-5; with equal micro-batches the ranks match
  // it to about 1e-8.
  TrainingRun single;
  single.accumulate = accumulate * 2;
  single.flat = flat;
  auto reference = train(data::Shard(), single, nullptr);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<torch::Tensor> parameters;
    torch::load(parameters, (dir / fmt::format("rank{}.pt", rank)).string());
    ASSERT_EQ(parameters.size(), reference.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_TRUE(torch::allclose(parameters[i], reference[i], 1e-5, 1e-5))
          << "rank " << rank << " parameter " << i << ": " << (parameters[i] - reference[i]).abs().max().item<double>();
    }
  }
}

// A rank whose model has another shape stops the job at the start, saying so.
TEST(DataParallel, RanksWithDifferentModelsFailAtTheStart) {
  auto results = run_ranks("DataParallelRank.Trains", [&](int rank) {
    return std::vector<std::string>{"AFTERBURNER_TEST_TIMEOUT=10",
                                    fmt::format("AFTERBURNER_TEST_CLASSES={}", rank == 0 ? 4 : 5)};
  });
  for (const auto& result : results) EXPECT_NE(result.exit_code, 0) << result.out << result.err;
  EXPECT_TRUE(testing::Contains(results[1].out, "rank 1: its model differs from rank 0's: parameter '5.weight'"))
      << results[1].out;
}

// A rank killed mid-training makes the other fail in its next backward instead of waiting.
TEST(DataParallel, ARankKilledMidTrainingMakesTheOtherFail) {
  auto results = run_ranks("DataParallelRank.Trains", [&](int rank) {
    return std::vector<std::string>{"AFTERBURNER_TEST_TIMEOUT=10",
                                    "AFTERBURNER_TEST_STEPS=100000",
                                    fmt::format("AFTERBURNER_TEST_KILL_AT_STEP={}", rank == 1 ? 5 : -1)};
  });
  EXPECT_EQ(results[1].exit_code, 128 + SIGKILL);
  EXPECT_NE(results[0].exit_code, 0);
  // Gloo's words for a dead peer: "Connection reset/closed by peer" when rank 0 reads first,
  // "Broken pipe" when it writes first (a SIGPIPE that ended rank 0 silently, before join_group
  // caught it).
  const bool names_the_peer = testing::Contains(results[0].out, "by peer") || testing::Contains(results[0].out, "Broken pipe");
  EXPECT_TRUE(names_the_peer) << "exit " << results[0].exit_code << "\n" << results[0].out << results[0].err;
}

INSTANTIATE_TEST_SUITE_P(Dist, TwoRanks, ::testing::Combine(::testing::Values(1, 2), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == 1 ? "EachStep" : "AccumulatingTwoMicroBatches") +
                                  (std::get<1>(info.param) ? "FlatSgd" : "LibTorchSgd");
                         });

}  // namespace
}  // namespace afterburner::dist
