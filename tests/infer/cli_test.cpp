// `afterburner optimize` end to end: output, refusal without --force, bad inputs.
#include <gtest/gtest.h>

#include <filesystem>

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
    std::vector<std::string> args{"optimize", input_.string(), "-o", output_.string(), "--measure-seconds", "0.02"};
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
  EXPECT_TRUE(Contains(result.out, "verified on 512 random inputs"));
  EXPECT_TRUE(Contains(result.out, "dropout removal: 1 of 1 removed"));
  EXPECT_TRUE(Contains(result.out, "BatchNorm: 1 of 1 removed"));
  EXPECT_TRUE(Contains(result.out, "top-1 agreement 100.00%"));
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
  };
  for (const auto& [args, field] : cases) {
    auto result = optimize(args);
    EXPECT_EQ(result.exit_code, 2) << field << ": " << result.err;
    EXPECT_TRUE(Contains(result.err, field));
  }
  EXPECT_FALSE(fs::exists(output_));
}

}  // namespace
}  // namespace afterburner::testing
