// --checkpoint-dir / --resume: a run killed with SIGKILL and resumed ends bitwise where an
// uninterrupted run ends; bad checkpoints are refused with one line naming the file.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <chrono>
#include <thread>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {
namespace fs = std::filesystem;

// Waits until `checkpoint` has been written twice (training is under way, with steps left) and
// kills the run; true if it was killed, false if it ended on its own first.
bool kill_once_checkpointed_twice(pid_t pid, const fs::path& checkpoint) {
  std::optional<fs::file_time_type> first_write;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    std::error_code missing;
    auto written = fs::last_write_time(checkpoint, missing);
    if (!missing) {
      if (!first_write) first_write = written;
      if (written != *first_write) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// Named parameters and buffers of an exported model.
std::map<std::string, torch::Tensor> exported_state(const fs::path& path) {
  auto module = torch::jit::load(path.string());
  std::map<std::string, torch::Tensor> state;
  for (const auto& p : module.named_parameters()) state[p.name] = p.value;
  for (const auto& b : module.named_buffers()) state["buffer " + b.name] = b.value;
  return state;
}

void expect_bitwise_equal(const fs::path& a, const fs::path& b) {
  auto state_a = exported_state(a), state_b = exported_state(b);
  ASSERT_FALSE(state_a.empty());
  ASSERT_EQ(state_a.size(), state_b.size());
  for (const auto& [name, tensor] : state_a) {
    ASSERT_TRUE(state_b.count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, state_b.at(name))) << name << " differs";
  }
}

std::map<std::string, std::string> resumable_flags(const TempDir& dir, const std::string& run) {
  return {{"--model", "cnn"},
          {"--max-steps", "60"},
          {"--checkpoint-dir", (dir / ("checkpoints-" + run)).string()},
          {"--checkpoint-every", "10"},
          {"--export", (dir / (run + ".pt")).string()},
          {"--report", (dir / (run + ".json")).string()}};
}

TEST(CliResume, KilledAndResumedRunEndsBitwiseWhereAnUninterruptedOneDoes) {
  TempDir dir;
  auto uninterrupted = run_cli(train_args(fashion_mnist_dir(), resumable_flags(dir, "a")));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.err;
  EXPECT_EQ(read_json(dir / "a.json").at("steps"), 60);

  auto flags = resumable_flags(dir, "b");
  pid_t pid = spawn_cli(train_args(fashion_mnist_dir(), flags));
  ASSERT_GT(pid, 0);
  bool killed = kill_once_checkpointed_twice(pid, dir / "checkpoints-b" / "checkpoint.pt");
  RecordProperty("killed_mid_run", killed ? "yes" : "no: the run ended first");
  ASSERT_TRUE(fs::exists(dir / "checkpoints-b" / "checkpoint.pt"));

  flags["--resume"] = "";
  auto resumed = run_cli(train_args(fashion_mnist_dir(), flags));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto report = read_json(dir / "b.json");
  EXPECT_EQ(report.at("steps"), 60);
  // The resumed session went on from the checkpoint rather than starting over.
  if (killed) {
    EXPECT_LT(report.at("timing").at("steps").get<int64_t>(), 60);
  }
  expect_bitwise_equal(dir / "a.pt", dir / "b.pt");
}

// Ctrl-C: the step in progress ends, the run writes its checkpoint, model and report, says so
// in one line and exits 130; resumed, it ends bit for bit where an uninterrupted run ends.
TEST(CliResume, CtrlCKeepsTheRunAndResumingItEndsWhereAnUninterruptedOneDoes) {
  TempDir dir;
  auto uninterrupted = run_cli(train_args(fashion_mnist_dir(), resumable_flags(dir, "a")));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.err;

  auto flags = resumable_flags(dir, "b");
  flags["--checkpoint-every"] = "0";  // the only checkpoint is the interrupted run's own
  flags["--log-jsonl"] = (dir / "b.jsonl").string();
  pid_t pid = spawn_cli(train_args(fashion_mnist_dir(), flags), dir / "b.err");
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (read_file(dir / "b.jsonl").find("\"step\":5,") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "ended by a signal";
  ASSERT_EQ(WEXITSTATUS(status), 130) << read_file(dir / "b.err");
  const auto report = read_json(dir / "b.json");
  EXPECT_EQ(report.at("stop_reason"), "interrupted");
  const int64_t steps = report.at("steps");
  EXPECT_LT(steps, 60);
  EXPECT_EQ(report.at("checkpointed_step"), steps);
  EXPECT_EQ(read_file(dir / "b.err"),
            fmt::format("afterburner: interrupted after step {}; wrote the checkpoint {} of step {} (--resume "
                        "continues), the model {} and the report {}\n",
                        steps, (dir / "checkpoints-b" / "checkpoint.pt").string(), steps, (dir / "b.pt").string(),
                        (dir / "b.json").string()));

  flags["--resume"] = "";
  auto resumed = run_cli(train_args(fashion_mnist_dir(), flags));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(read_json(dir / "b.json").at("steps"), 60);
  expect_bitwise_equal(dir / "a.pt", dir / "b.pt");
}

class CliResumeSynthetic : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_mnist(dir_.path(), 256, 64); }

  std::map<std::string, std::string> flags(const std::string& model, const std::string& run) const {
    return {{"--model", model},
            {"--batch-size", "32"},
            {"--max-steps", "4"},
            {"--checkpoint-dir", checkpoint_dir().string()},
            {"--export", (dir_ / (run + ".pt")).string()},
            {"--report", (dir_ / (run + ".json")).string()}};
  }
  CommandResult train(std::map<std::string, std::string> flags, bool resume) {
    if (resume) flags["--resume"] = "";
    return run_cli(train_args(dir_.path(), flags));
  }
  fs::path checkpoint_dir() const { return dir_ / "checkpoints"; }
  fs::path checkpoint() const { return checkpoint_dir() / "checkpoint.pt"; }

  TempDir dir_;
};

// A run that stopped at --max-steps has nothing left to do when resumed.
TEST_F(CliResumeSynthetic, ResumingAFinishedRunChangesNothing) {
  auto first = train(flags("cnn", "first"), /*resume=*/false);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto again = train(flags("cnn", "again"), /*resume=*/true);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(read_json(dir_ / "again.json").at("steps"), 4);
  expect_bitwise_equal(dir_ / "first.pt", dir_ / "again.pt");
}

TEST_F(CliResumeSynthetic, CorruptCheckpointIsNamed) {
  fs::create_directories(checkpoint_dir());
  write_file(checkpoint(), "this is not a checkpoint");
  EXPECT_TRUE(fails_with(train(flags("cnn", "r"), /*resume=*/true), 1, {checkpoint().string()}));
}

TEST_F(CliResumeSynthetic, TruncatedCheckpointIsNamed) {
  ASSERT_EQ(train(flags("cnn", "first"), /*resume=*/false).exit_code, 0);
  std::string bytes = read_file(checkpoint());
  write_file(checkpoint(), bytes.substr(0, bytes.size() / 2));
  EXPECT_TRUE(fails_with(train(flags("cnn", "r"), /*resume=*/true), 1, {checkpoint().string()}));
}

TEST_F(CliResumeSynthetic, MissingCheckpointIsNamed) {
  EXPECT_TRUE(fails_with(train(flags("cnn", "r"), /*resume=*/true), 1, {checkpoint().string()}));
}

TEST_F(CliResumeSynthetic, CheckpointOfAnotherModelNamesBothModels) {
  ASSERT_EQ(train(flags("cnn", "first"), /*resume=*/false).exit_code, 0);
  EXPECT_TRUE(fails_with(train(flags("mlp", "r"), /*resume=*/true), 1, {checkpoint().string(), "cnn", "mlp"}));
}

}  // namespace
}  // namespace afterburner::testing
