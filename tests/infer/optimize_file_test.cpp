// optimize_file's flow for large models: the verification scaled to its time, the batch sizes
// measured, and the progress reported step by step as it happens.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize_file.h"
#include "test_models.h"
#include "testing.h"

namespace afterburner::testing {
namespace {
namespace fs = std::filesystem;
using Step = infer::OptimizeFileProgress::Step;

class OptimizeFileFlow : public ::testing::Test {
 protected:
  void SetUp() override { infer::save_model(conv_bn_dropout_model(), input_.string()); }

  infer::OptimizeFileReport optimize(const infer::OptimizeFileOptions& options) {
    return infer::optimize_file(input_.string(), output_.string(), options);
  }

  // All 512 verified however busy the machine, unless a test says otherwise.
  static infer::OptimizeFileOptions random_inputs() {
    return infer::OptimizeFileOptions().input_shape({1, 8, 8}).verify_seconds(1e6);
  }

  TempDir dir_;
  fs::path input_ = dir_ / "model.pt";
  fs::path output_ = dir_ / "model-opt.pt";
};

TEST_F(OptimizeFileFlow, VerifiesOnAsManyInputsAsItsTimeAllows) {
  auto all = optimize(random_inputs().measure_seconds(0));
  EXPECT_EQ(all.verified_on, "512 random inputs");
  EXPECT_EQ(all.agreement.samples, 512);

  // Less time than one sample takes: the fewest samples verification runs on.
  auto fewest = optimize(random_inputs().verify_seconds(1e-12).measure_seconds(0));
  EXPECT_TRUE(Contains(fewest.verified_on, fmt::format("{} of 512 random inputs (what 1e-12 s of verification allows at ",
                                                       infer::kMinVerifiedSamples)))
      << fewest.verified_on;
  EXPECT_EQ(fewest.agreement.samples, infer::kMinVerifiedSamples);
  EXPECT_TRUE(fs::exists(output_));
}

// The user's examples are theirs to size: all are verified.
TEST_F(OptimizeFileFlow, VerifiesOnEveryExampleInput) {
  const auto examples = dir_ / "examples.pt";
  const auto bytes = torch::jit::pickle_save(torch::randn({40, 1, 8, 8}));
  write_file(examples, std::string(bytes.begin(), bytes.end()));
  auto report = optimize(infer::OptimizeFileOptions().example_inputs(examples.string()).verify_seconds(1e-12).measure_seconds(0));
  EXPECT_EQ(report.verified_on, "40 example inputs from " + examples.string());
  EXPECT_EQ(report.agreement.samples, 40);
}

TEST_F(OptimizeFileFlow, MeasuresTheBatchSizesAskedFor) {
  auto report = optimize(random_inputs().batch_sizes({3, 5}).measure_seconds(0.001));
  for (const auto* speed : {&report.before, &report.after}) {
    ASSERT_EQ(speed->points.size(), 2u);
    EXPECT_EQ(speed->points[0].batch_size, 3);
    EXPECT_EQ(speed->points[1].batch_size, 5);
  }
}

// Checked before the minutes of verification a large model takes: nothing is written.
TEST_F(OptimizeFileFlow, BadBatchSizesAreRefusedBeforeAnyWork) {
  auto message = error_message<UsageError>([&] { optimize(random_inputs().batch_sizes({4, 0})); });
  EXPECT_TRUE(Contains(message, "batch_sizes"));
  EXPECT_FALSE(fs::exists(output_));
  // Unless nothing is measured.
  EXPECT_NO_THROW(optimize(random_inputs().batch_sizes({}).measure_seconds(0)));
}

TEST_F(OptimizeFileFlow, ReportsEachStepAsItHappens) {
  struct Seen {
    Step step;
    int64_t batch_size;  // 0: the step starts
    bool written;        // the output file exists by then
  };
  std::vector<Seen> seen;
  auto report = optimize(random_inputs().batch_sizes({2, 4}).measure_seconds(0.001).on_progress(
      [&](const infer::OptimizeFileProgress& progress) {
        if (progress.step == Step::verifying) {
          EXPECT_EQ(progress.report.verified_on, "512 random inputs");
        }
        if (progress.step == Step::written) {
          EXPECT_FALSE(progress.report.passes.empty());
        }
        seen.push_back({progress.step, progress.measured ? progress.measured->batch_size : 0, fs::exists(output_)});
      }));
  const std::vector<std::pair<Step, int64_t>> expected{
      {Step::verifying, 0},        {Step::written, 0},         {Step::measuring_before, 0}, {Step::measuring_before, 2},
      {Step::measuring_before, 4}, {Step::measuring_after, 0}, {Step::measuring_after, 2},  {Step::measuring_after, 4}};
  ASSERT_EQ(seen.size(), expected.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].step, expected[i].first) << i;
    EXPECT_EQ(seen[i].batch_size, expected[i].second) << i;
    EXPECT_EQ(seen[i].written, i > 0) << i;
  }
  EXPECT_EQ(report.after.points.size(), 2u);
}

}  // namespace
}  // namespace afterburner::testing
