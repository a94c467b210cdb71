// --export: the TorchScript file loads in C++ and in Python's PyTorch, and both compute the
// same outputs (checked by bench/export_reference.py --check).
#include <gtest/gtest.h>
#include <torch/script.h>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

class CliExport : public ::testing::TestWithParam<std::string> {
 protected:
  // Trains `model` for a few steps on a synthetic set and exports it; returns the export.
  std::filesystem::path train_and_export(const std::string& model) {
    write_synthetic_mnist(dir_.path(), 256, 64);
    auto path = dir_ / (model + ".pt");
    auto result = run_cli(train_args(dir_.path(), {{"--model", model},
                                                   {"--max-steps", "3"},
                                                   {"--batch-size", "32"},
                                                   {"--export", path.string()}}));
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return path;
  }

  TempDir dir_;
};

TEST_P(CliExport, PythonComputesWhatCppComputes) {
  auto model_path = train_and_export(GetParam());
  auto model = torch::jit::load(model_path.string());
  torch::manual_seed(0);
  auto input = torch::randn({4, 1, 28, 28});
  torch::Tensor output;
  {
    torch::InferenceMode inference;
    output = model.forward({input}).toTensor();
  }
  ASSERT_EQ(output.sizes(), (std::vector<int64_t>{4, 10}));
  ASSERT_TRUE(torch::isfinite(output).all().item<bool>());
  write_io_fixture(dir_ / "io.pt", input, output);

  auto check = python_check(model_path, dir_ / "io.pt");
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  EXPECT_NE(check.out.find(": match"), std::string::npos) << check.out << check.err;
}

INSTANTIATE_TEST_SUITE_P(Models, CliExport, ::testing::Values("cnn", "mlp", "resnet"));

// The check above can fail: a different expected output is reported as a mismatch.
TEST(CliExportCheck, PythonCheckRejectsAnotherOutput) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 256, 64);
  auto model_path = dir / "mlp.pt";
  auto trained =
      run_cli(train_args(dir.path(), {{"--model", "mlp"}, {"--max-steps", "1"}, {"--export", model_path.string()}}));
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  auto model = torch::jit::load(model_path.string());
  auto input = torch::randn({4, 1, 28, 28});
  torch::Tensor output;
  {
    torch::InferenceMode inference;
    output = model.forward({input}).toTensor() + 1e-3;
  }
  write_io_fixture(dir / "io.pt", input, output);
  auto check = python_check(model_path, dir / "io.pt");
  EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
  EXPECT_NE(check.out.find("MISMATCH"), std::string::npos) << check.out;
}

}  // namespace
}  // namespace afterburner::testing
