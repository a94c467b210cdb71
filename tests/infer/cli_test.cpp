// `afterburner optimize` end to end: output, refusal without --force, bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "afterburner/infer/model_file.h"
#include "test_models.h"
#include "testing.h"

namespace afterburner::testing {
namespace {
namespace fs = std::filesystem;

class CliOptimize : public ::testing::Test {
 protected:
  void SetUp() override { infer::save_model(trained_zoo_model("mlp"), input_.string()); }

  CommandResult optimize(const std::vector<std::string>& extra) {
    // All 10000 test images verified however busy the machine: the counts below are exact.
    std::vector<std::string> args{"optimize", input_.string(), "-o", output_.string(), "--measure-seconds", "0.02",
                                  "--verify-seconds", "1e6"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }

  TempDir dir_;
  fs::path input_ = dir_ / "mlp.pt";
  fs::path output_ = dir_ / "mlp-opt.pt";
};

TEST_F(CliOptimize, WritesAVerifiedModelAndReportsSpeed) {
  auto result = optimize({"--precision", "int8"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const auto* part : {"int8: 3 Linear layers", "agreement: max abs diff", "10000 samples", "before (original",
                           "after (int8", "batch 1:", "batch 64:", "best batch size after"}) {
    EXPECT_TRUE(Contains(result.out, part));
  }
  auto written = infer::load_model(output_.string());
  auto original = infer::load_model(input_.string());
  auto images = fashion_mnist_images("t10k", 500);
  c10::InferenceMode inference;
  auto agree = written.forward({images}).toTensor().argmax(1).eq(original.forward({images}).toTensor().argmax(1));
  EXPECT_GE(agree.to(torch::kDouble).mean().item<double>(), 0.99);
}

TEST_F(CliOptimize, RefusesADisagreeingModelUnlessForced) {
  // int8 logits cannot match fp32 to 1e-9: verification must fail.
  auto refused = optimize({"--precision", "int8", "--tolerance", "1e-9"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(Contains(refused.err, output_.string() + ": not written, verification failed"));
  EXPECT_TRUE(Contains(refused.err, "--force"));
  EXPECT_FALSE(fs::exists(output_));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_.path()), {}), 1) << "nothing but the input";

  auto forced = optimize({"--precision", "int8", "--tolerance", "1e-9", "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_TRUE(Contains(forced.err, "writing anyway (--force)"));
  EXPECT_NO_THROW(infer::load_model(output_.string()));
}

TEST_F(CliOptimize, ModelSavedInTrainingModeVerifiesOnRandomInputs) {
  infer::save_model(conv_bn_dropout_model(), input_.string());  // BatchNorm + Dropout, training mode
  auto result = optimize({"--input-shape", "1,8,8"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(Contains(result.out, "verifying on 512 random inputs"));
  EXPECT_TRUE(Contains(result.out, "dropout removal: 1 of 1 removed"));
  EXPECT_TRUE(Contains(result.out, "BatchNorm: 1 of 1 removed"));
  EXPECT_TRUE(Contains(result.out, "top-1 agreement 100.00%"));
}

// Each step is printed as it happens, in the order the flow takes, on the batch sizes asked for.
TEST_F(CliOptimize, PrintsEachStepOnTheBatchSizesAskedFor) {
  auto result = optimize({"--batch-sizes", "2,5"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  size_t at = 0;
  for (const auto* line : {"verifying on 10000 Fashion-MNIST test images", "passes:", "agreement:", "wrote ",
                           "before (original, TorchScript as loaded):\n  batch 2: ", "\n  batch 5: ",
                           "after (fp32, as infer::load_optimized runs it):\n  batch 2: ", "\n  batch 5: ",
                           "best batch size after: "}) {
    const auto found = result.out.find(line, at);
    ASSERT_NE(found, std::string::npos) << "'" << line << "' after position " << at << " of:\n" << result.out;
    at = found + 1;
  }
  EXPECT_FALSE(Contains(result.out, "batch 1:")) << result.out;
  EXPECT_FALSE(Contains(result.out, "batch 64:")) << result.out;
}

// A budget shorter than any call: one untimed and one timed call per batch size, and it says so.
TEST_F(CliOptimize, ASmallTimeBudgetTimesOneCall) {
  auto result = run_cli({"optimize", input_.string(), "-o", output_.string(), "--batch-sizes", "1,64",
                         "--measure-seconds", "1e-9"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  size_t lines = 0;
  for (size_t at = result.out.find("  batch "); at != std::string::npos; at = result.out.find("  batch ", at + 1)) {
    const auto line = result.out.substr(at, result.out.find('\n', at) - at);
    EXPECT_TRUE(Contains(line, "(1 call timed)")) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 4u) << result.out;
}

TEST_F(CliOptimize, CorruptModelFileIsNamed) {
  write_file(input_, "not a model");
  auto result = optimize({});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(Contains(result.err, input_.string() + ": not a loadable TorchScript model"));
  EXPECT_FALSE(fs::exists(output_));
}

TEST_F(CliOptimize, UsageErrorsNameTheOption) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--precision", "fp16"}, "precision"},
      {{"--input-shape", "1,x,28"}, "--input-shape"},
      {{"--min-agreement", "1.5"}, "--min-agreement"},
      {{"--input-shape", "3,32,32", "--data", "/tmp"}, "data: Fashion-MNIST verification needs the input shape 1,28,28"},
      {{"--batch-sizes", "16,0"}, "--batch-sizes: expected positive integers separated by commas, got '16,0'"},
      {{"--batch-sizes", "1,x"}, "--batch-sizes: expected positive integers separated by commas, got '1,x'"},
      {{"--batch-sizes", ""}, "--batch-sizes"},
      {{"--verify-seconds", "0"}, "--verify-seconds: must be a positive number, got '0'"},
  };
  for (const auto& [args, field] : cases) {
    auto result = optimize(args);
    EXPECT_EQ(result.exit_code, 2) << field << ": " << result.err;
    EXPECT_TRUE(Contains(result.err, field)) << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << "one line: " << result.err;
  }
  EXPECT_FALSE(fs::exists(output_));
}

}  // namespace
}  // namespace afterburner::testing
