// `train --sketch` and `afterburner sketch`: sketched models train, checkpoint, export as
// TorchScript that Python runs, and bad input gets one error line.
#include <signal.h>
#include <sys/wait.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

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

TEST_F(CliSketch, TrainSketchesLayersAsTheirOwnSketchesSay) {
  const auto exported = dir_ / "mlp-layers.pt";
  auto result = train({{"--model", "mlp"}, {"--sketch", ""}, {"--sketch-rank", "8"}, {"--sketch-layers", "3=2:16,1=keep"},
                       {"--max-steps", "2"}, {"--batch-size", "32"}, {"--export", exported.string()}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(Contains(result.err, "sketch: 1 (Linear [1024, 784]) kept: kept by the per-layer plan")) << result.err;
  EXPECT_TRUE(Contains(result.err, "sketch: 3 (Linear [1024, 1024]): 2 terms of rank 16")) << result.err;
  auto model = torch::jit::load(exported.string());
  EXPECT_EQ(model.attr("layer3").toModule().attr("S1s").toTensor().sizes(), (std::vector<int64_t>{2, 1024, 16}));
  EXPECT_TRUE(model.attr("layer1").toModule().hasattr("weight"));
  expect_python_agrees(exported, dir_ / "io.pt");

  EXPECT_TRUE(fails_with(train({{"--model", "mlp"}, {"--sketch", ""}, {"--sketch-layers", "3=2"}}), 2,
                         {"--sketch-layers: '3=2': expected NAME=L:k, NAME=m:M or NAME=keep"}));
  EXPECT_TRUE(fails_with(train({{"--model", "mlp"}, {"--sketch-layers", "3=keep"}}), 2, {"--sketch-layers: needs --sketch"}));
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
  EXPECT_TRUE(Contains(result.out, "layer1 (Linear [1024, 784]): 2 terms of rank 16, 58880 of 803840 parameters"));
  EXPECT_TRUE(Contains(result.out, "layer5 (Linear [10, 1024]) kept"));
  EXPECT_TRUE(Contains(result.out, "2 of 3 layers sketched"));
  auto model = torch::jit::load(sketched.string());
  EXPECT_EQ(model.attr("layer3").toModule().attr("S2s").toTensor().sizes(), (std::vector<int64_t>{2, 16, 1024}));
  expect_python_agrees(sketched, dir_ / "io.pt");

  // Layers of their own: one kept, one at another L and k, the rest model-wide.
  auto per_layer = run_cli({"sketch", dense.string(), "-o", sketched.string(), "--rank", "16", "--layers",
                            "layer1=keep,layer3=2:8"});
  ASSERT_EQ(per_layer.exit_code, 0) << per_layer.err;
  EXPECT_TRUE(Contains(per_layer.out, "layer1 (Linear [1024, 784]) kept: kept by the per-layer plan"));
  EXPECT_TRUE(Contains(per_layer.out, "layer3 (Linear [1024, 1024]): 2 terms of rank 8"));
  EXPECT_EQ(torch::jit::load(sketched.string()).attr("layer3").toModule().attr("S1s").toTensor().sizes(),
            (std::vector<int64_t>{2, 1024, 8}));
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
  EXPECT_TRUE(fails_with(run_cli({"sketch", dense.string(), "-o", out.string(), "--rank", "8,16"}), 2,
                         {"--rank: takes one number (a list with --tune only)"}));
  EXPECT_TRUE(fails_with(run_cli({"sketch", dense.string(), "-o", out.string(), "--rank", "8", "--layers", "layer1"}), 2,
                         {"--layers: 'layer1': expected NAME=L:k, NAME=m:M or NAME=keep"}));
  EXPECT_FALSE(std::filesystem::exists(out));

  const auto frozen = dir_ / "mlp-opt.pt";
  ASSERT_EQ(run_cli({"optimize", dense.string(), "-o", frozen.string(), "--measure-seconds", "0"}).exit_code, 0);
  EXPECT_TRUE(fails_with(run_cli({"sketch", frozen.string(), "-o", out.string(), "--rank", "4"}), 1,
                         {frozen.string(), "no Linear, Conv2d or MultiheadAttention submodule to sketch",
                          "sketch before optimizing"}));
  // Attention's options: a positive number of features, a known kernel, and the kernel only with them.
  for (const std::vector<std::string>& attention : std::vector<std::vector<std::string>>{
           {"--attention-features", "0"}, {"--attention-kernel", "relu"}, {"--attention-features", "8,16"},
           {"--attention-features", "8", "--attention-kernel", "cosine"}}) {
    std::vector<std::string> args{"sketch", dense.string(), "-o", out.string()};
    args.insert(args.end(), attention.begin(), attention.end());
    EXPECT_EQ(run_cli(args).exit_code, 2) << attention.back();
  }
  // The mlp holds no attention: features alone sketch nothing.
  EXPECT_TRUE(fails_with(run_cli({"sketch", dense.string(), "-o", out.string(), "--attention-features", "8"}), 1,
                         {dense.string(), "no layer was sketched"}));
  EXPECT_FALSE(std::filesystem::exists(out));
}

// `sketch --tune` on the synthetic set: a quiet, short, single-threaded recipe, speeds measured
// briefly, the outputs beside `out`.
std::vector<std::string> tune_args(const std::filesystem::path& data, const std::filesystem::path& out,
                                   const std::string& target, const std::vector<std::string>& more = {}) {
  std::vector<std::string> args{"sketch", "--tune",         "--model",         "mlp",   "--data", data.string(),
                                "--epochs", "1",            "--batch-size",    "32",    "--threads", "1",
                                "--precision", "fp32",      "--measure-seconds", "0.05", "--target-accuracy", target,
                                "-o",       out.string()};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A target every plan reaches: the search must end at the fastest plan, and its outputs must be
// what the plan says: the model (sketched as planned, Python runs it), a plan `train --config`
// trains again, and the frontier.
TEST_F(CliSketch, TuneWritesTheFastestPlanThatReachesTheTarget) {
  const auto out = dir_ / "mlp-sketched.pt";
  auto result = run_cli(tune_args(dir_.path(), out, "0.01"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto table = result.out.substr(result.out.find("\ndense"));
  const auto first_plan = table.substr(1 + table.find('\n', 1));  // the fastest plan's row
  EXPECT_TRUE(Contains(first_plan.substr(0, first_plan.find('\n')), "chosen")) << result.out;

  const std::string plan = read_text(dir_ / "mlp-sketched.plan.toml");
  // The first Linear as the plan's comments describe it, model-wide or per layer:
  // "1 (Linear [1024, 784]): 2 terms of rank 16, 58880 of 803840 parameters".
  const auto described = plan.find("#   1 (Linear [1024, 784]): ");
  ASSERT_NE(described, std::string::npos) << plan;
  const std::string layer1 = plan.substr(described + 4, plan.find('\n', described) - described - 4);
  const std::string sketch = layer1.substr(layer1.find("): ") + 3);
  const int64_t terms = Contains(sketch, " terms of rank ") ? std::stoll(sketch) : 1;
  const int64_t rank = std::stoll(sketch.substr(sketch.find("rank ") + 5));
  ASSERT_GT(rank, 0) << plan;
  EXPECT_TRUE(Contains(plan, "sketch = true"));
  EXPECT_FALSE(Contains(plan, "target_accuracy")) << "the search's target is no early stop of the recipe";
  auto model = torch::jit::load(out.string());
  EXPECT_EQ(model.attr("layer1").toModule().attr("S1s").toTensor().sizes(), (std::vector<int64_t>{terms, 784, rank}));
  expect_python_agrees(out, dir_ / "io.pt");
  EXPECT_TRUE(Contains(read_text(dir_ / "mlp-sketched.frontier.svg"), "<svg"));

  auto again = run_cli({"train", "--config", (dir_ / "mlp-sketched.plan.toml").string(), "--data", dir_.path().string(),
                        "--max-steps", "1", "--threads", "1", "--progress", "none"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(Contains(again.err, "sketch: " + layer1)) << again.err;  // the plan trains again as described
}

// --terms and --rank choose the model-wide plans searched; --no-per-layer keeps them model-wide.
TEST_F(CliSketch, TuneSearchesTheTermsAndRanksGiven) {
  const auto out = dir_ / "mlp-sketched.pt";
  auto result = run_cli(tune_args(dir_.path(), out, "0.01", {"--terms", "1", "--rank", "16,64", "--no-per-layer"}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto table = result.out.substr(result.out.find("\ndense"));
  EXPECT_TRUE(Contains(table, "\nL 1 k 16 ")) << table;
  EXPECT_TRUE(Contains(table, "\nL 1 k 64 ")) << table;
  std::size_t plans = 0;
  for (auto at = table.find("\nL "); at != std::string::npos; at = table.find("\nL ", at + 1)) ++plans;
  EXPECT_EQ(plans, 2u) << table;
  EXPECT_FALSE(Contains(read_text(dir_ / "mlp-sketched.plan.toml"), "sketch_layers"));
}

TEST_F(CliSketch, TuneRefusesInOneLineWhenNoPlanReachesTheTarget) {
  const auto out = dir_ / "never.pt";
  EXPECT_TRUE(fails_with(run_cli(tune_args(dir_.path(), out, "1", {"--max-steps", "1"})), 1,
                         {"no sketched plan of mlp reaches 1 on the validation split", "nothing written"}));
  for (const char* file : {"never.pt", "never.plan.toml", "never.frontier.svg"}) {
    EXPECT_FALSE(std::filesystem::exists(dir_ / file)) << file;
  }
}

// Ctrl-C once a plan has trained: the training in progress ends, the search keeps what it
// trained, writes the fastest plan so far that reached the target, and exits 130.
TEST(CliSketchTune, CtrlCWritesTheFastestPlanTrainedSoFar) {
  TempDir dir;
  const auto out = dir / "mlp-sketched.pt", log = dir / "out.txt";
  auto args = tune_args(fashion_mnist_dir(), out, "0.01");
  pid_t pid = spawn_cli(args, dir / "err.txt", log);
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  // "sketch --tune: L 2 k 32: validation accuracy 0.8932 (...)" (the dense model's line has no colon there)
  auto plan_trained = [&] { return read_file(log).find(": validation accuracy ") != std::string::npos; };
  while (!plan_trained() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "ended by a signal";
  const std::string printed = read_file(log);
  ASSERT_EQ(WEXITSTATUS(status), 130) << printed << read_file(dir / "err.txt");
  EXPECT_TRUE(Contains(printed, "interrupted: the search ended early; its choice is the fastest plan trained so far"))
      << printed;
  EXPECT_TRUE(Contains(printed, "chosen")) << printed;
  EXPECT_TRUE(std::filesystem::exists(out));
  EXPECT_TRUE(std::filesystem::exists(dir / "mlp-sketched.plan.toml"));
  EXPECT_NO_THROW(torch::jit::load(out.string()));
}

TEST_F(CliSketch, TuneBadInputGetsOneErrorLine) {
  const auto out = dir_ / "out.pt";
  EXPECT_TRUE(fails_with(run_cli(tune_args(dir_.path(), out, "0")), 2, {"--target-accuracy: must be in (0, 1], got 0"}));
  EXPECT_TRUE(fails_with(run_cli(tune_args(dir_.path(), out, "0.5", {"--max-accuracy-drop", "0.01"})), 2,
                         {"--max-accuracy-drop: give it or --target-accuracy, not both"}));
  auto file_model = tune_args(dir_.path(), out, "0.5");
  file_model[3] = (dir_ / "mine.pt").string();
  EXPECT_TRUE(fails_with(run_cli(file_model), 1, {(dir_ / "mine.pt").string(), "no such model file"}));
  EXPECT_TRUE(fails_with(run_cli(tune_args(dir_.path(), dir_ / "absent" / "out.pt", "0.5")), 1,
                         {"out.pt (-o): its directory does not exist"}));
  auto positional = tune_args(dir_.path(), out, "0.5");
  positional.push_back((dir_ / "mlp.pt").string());
  EXPECT_TRUE(fails_with(run_cli(positional), 2, {"sketch --tune", "takes the model as --model (a zoo model or a file)"}));
  EXPECT_TRUE(fails_with(run_cli({"sketch", (dir_ / "mlp.pt").string(), "-o", out.string(), "--rank", "4", "--epochs",
                                  "2"}),
                         2, {"--epochs: is a training option: it applies to sketch --tune only"}));
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace afterburner::testing
