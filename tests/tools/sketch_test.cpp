// `train --sketch` and `afterburner sketch`: sketched models train, checkpoint, export as
// TorchScript that Python runs, and bad input gets one error line.
#include <gtest/gtest.h>
#include <torch/script.h>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

int64_t trainable_parameters(const torch::jit::Module& model) {
  int64_t count = 0;
  for (const auto& p : model.parameters()) count += p.numel();
  return count;
}

// Python's torch.jit.load runs `model_path` and reproduces the C++ output.
void expect_python_agrees(const std::filesystem::path& model_path, const std::filesystem::path& io_path) {
  auto model = torch::jit::load(model_path.string());
  const torch::Tensor input = torch::randn({4, 1, 28, 28});
  torch::NoGradGuard no_grad;
  write_io_fixture(io_path, input, model.forward({input}).toTensor());
  auto check = python_check(model_path, io_path);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

class CliSketch : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_mnist(dir_.path(), 256, 64); }

  CommandResult train(const std::map<std::string, std::string>& flags) {
    auto args = train_args(dir_.path(), flags);
    return run_cli(args);
  }

  TempDir dir_;
};

TEST_F(CliSketch, TrainSketchedMlpExportsSketchedLayersPythonRuns) {
  const auto exported = dir_ / "mlp-sketched.pt";
  auto result = train({{"--model", "mlp"}, {"--sketch", ""}, {"--sketch-rank", "8"}, {"--max-steps", "3"},
                       {"--batch-size", "32"}, {"--export", exported.string()}, {"--report", (dir_ / "r.json").string()}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(Contains(result.err, "sketch: 1 (Linear [1024, 784]): rank 8"));
  EXPECT_TRUE(Contains(result.err, "sketch: 5 (Linear [10, 1024]) kept: rank 8 would not save"));

  auto model = torch::jit::load(exported.string());
  const auto layer = model.attr("layer1").toModule();
  EXPECT_EQ(layer.attr("S1s").toTensor().sizes(), (std::vector<int64_t>{1, 784, 8}));
  EXPECT_EQ(layer.attr("S2s").toTensor().sizes(), (std::vector<int64_t>{1, 8, 1024}));
  EXPECT_EQ(layer.attr("U1s").toTensor().sizes(), (std::vector<int64_t>{1, 8, 1024}));
  EXPECT_EQ(layer.attr("U2s").toTensor().sizes(), (std::vector<int64_t>{1, 784, 8}));
  EXPECT_EQ(layer.attr("bias").toTensor().sizes(), (std::vector<int64_t>{1024}));
  const int64_t expected = 8 * (784 + 1024) + 1024 + 8 * 2048 + 1024 + 1024 * 10 + 10;
  EXPECT_EQ(trainable_parameters(model), expected);
  EXPECT_EQ(read_json(dir_ / "r.json")["trainable_parameters"].get<int64_t>(), expected);
  expect_python_agrees(exported, dir_ / "io.pt");
}

TEST_F(CliSketch, TrainSketchedCnnResumesFromItsCheckpoint) {
  const auto checkpoints = dir_ / "ckpt";
  std::map<std::string, std::string> flags{{"--model", "cnn"}, {"--sketch", ""}, {"--sketch-budget", "0.3"},
                                           {"--batch-size", "32"}, {"--checkpoint-dir", checkpoints.string()},
                                           {"--checkpoint-every", "2"}, {"--max-steps", "2"}};
  auto first = train(flags);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_TRUE(Contains(first.err, "sketch: 0 (Conv2d [32, 1, 3, 3])"));
  flags["--resume"] = "";
  flags["--max-steps"] = "4";
  flags["--export"] = (dir_ / "cnn.pt").string();
  auto resumed = train(flags);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  expect_python_agrees(dir_ / "cnn.pt", dir_ / "io.pt");
}

TEST_F(CliSketch, SketchRewritesAnExportedModel) {
  const auto dense = dir_ / "mlp.pt", sketched = dir_ / "mlp-sketched.pt";
  ASSERT_EQ(train({{"--model", "mlp"}, {"--max-steps", "1"}, {"--export", dense.string()}}).exit_code, 0);
  auto result = run_cli({"sketch", dense.string(), "-o", sketched.string(), "--terms", "2", "--rank", "16"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(Contains(result.out, "layer1 (Linear [1024, 784]): rank 16, 58880 of 803840 parameters"));
  EXPECT_TRUE(Contains(result.out, "layer5 (Linear [10, 1024]) kept"));
  EXPECT_TRUE(Contains(result.out, "2 of 3 layers sketched"));
  auto model = torch::jit::load(sketched.string());
  EXPECT_EQ(model.attr("layer3").toModule().attr("S2s").toTensor().sizes(), (std::vector<int64_t>{2, 16, 1024}));
  expect_python_agrees(sketched, dir_ / "io.pt");
}

TEST_F(CliSketch, BadInputGetsOneErrorLineAndWritesNothing) {
  const auto dense = dir_ / "mlp.pt", out = dir_ / "out.pt";
  ASSERT_EQ(train({{"--model", "mlp"}, {"--max-steps", "1"}, {"--export", dense.string()}}).exit_code, 0);
  EXPECT_TRUE(fails_with(run_cli({"sketch", (dir_ / "absent.pt").string(), "-o", out.string(), "--rank", "4"}), 1,
                         {(dir_ / "absent.pt").string(), "no such model file"}));
  EXPECT_TRUE(fails_with(run_cli({"sketch", dense.string(), "-o", out.string(), "--budget", "1.5"}), 2,
                         {"sketch budget: must be in (0, 1), got 1.5"}));
  EXPECT_TRUE(fails_with(run_cli({"sketch", dense.string(), "-o", out.string()}), 2, {"give a rank or a budget"}));
  EXPECT_EQ(run_cli({"sketch", dense.string(), "-o", out.string(), "--rank", "4", "--budget", "0.5"}).exit_code, 2);
  EXPECT_TRUE(fails_with(run_cli({"sketch", dense.string(), "-o", out.string(), "--rank", "1000"}), 1,
                         {dense.string(), "no layer was sketched"}));
  EXPECT_FALSE(std::filesystem::exists(out));

  const auto frozen = dir_ / "mlp-opt.pt";
  ASSERT_EQ(run_cli({"optimize", dense.string(), "-o", frozen.string(), "--measure-seconds", "0"}).exit_code, 0);
  EXPECT_TRUE(fails_with(run_cli({"sketch", frozen.string(), "-o", out.string(), "--rank", "4"}), 1,
                         {frozen.string(), "no Linear or Conv2d submodule to sketch", "sketch before optimizing"}));
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace afterburner::testing
