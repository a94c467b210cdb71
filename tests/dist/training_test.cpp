// `afterburner train --nproc N` end to end: real rank processes started by the CLI's launcher,
// on a small synthetic dataset; against one rank of the same job, on two hosts (network
// namespaces), across a resume, and when a rank dies.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <future>
#include <string>

#include "afterburner/dist/launch.h"
#include "fixtures.h"
#include "testing.h"
#include "tools/cli_helpers.h"

namespace afterburner::dist {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;

struct Job {
  testing::TempDir dir;
  std::string model = "cnn";
  Job() { testing::write_synthetic_mnist(dir.path()); }

  // `train` of `model` on the synthetic set, batch 32 (16 steps an epoch), with `flags` added.
  std::vector<std::string> args(std::map<std::string, std::string> flags) const {
    flags.emplace("--model", model);
    flags.emplace("--batch-size", "32");
    flags.emplace("--lr", "0.05");
    return testing::train_args(dir.path(), flags);
  }
};

std::vector<torch::Tensor> parameters_of(const fs::path& exported) {
  std::vector<torch::Tensor> parameters;
  for (const auto& p : torch::jit::load(exported.string()).parameters()) parameters.push_back(p);
  return parameters;
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

// Two ranks with 16 samples each per step take the same steps as one rank with 32: the same
// samples (DistributedSampler's order), their gradients averaged by the Reducer, and for the
// resnet its BatchNorm layers normalising over both ranks' samples (SyncBatchNorm2d).
class TwoRanksOfModel : public ::testing::TestWithParam<std::string> {};

TEST_P(TwoRanksOfModel, EndWhereOneRankOfTheSameJobEnds) {
  Job job;
  job.model = GetParam();
  // The resnet's early training amplifies rounding: one process ends 3e-5 away from itself after
  // 12 steps with 2 threads instead of 1 (plain BatchNorm, Fashion-MNIST). Its ranks are compared
  // after 3 steps, where rounding is still rounding (6e-8 apart), the cnn's after 12.
  const std::string steps = job.model == "resnet" ? "3" : "12";
  CommandResult one;
  {
    ScopedEnvironment torchrun;  // a job of one rank, as torchrun would start it
    torchrun.set("RANK", "0");
    torchrun.set("WORLD_SIZE", "1");
    torchrun.set("MASTER_ADDR", "127.0.0.1");
    torchrun.set("MASTER_PORT", std::to_string(free_port("127.0.0.1")));
    one = testing::run_cli(job.args({{"--max-steps", steps}, {"--export", (job.dir / "one.pt").string()},
                                     {"--report", (job.dir / "one.json").string()}}));
  }
  ASSERT_EQ(one.exit_code, 0) << one.err;
  auto two = testing::run_cli(job.args({{"--nproc", "2"}, {"--max-steps", steps},
                                        {"--export", (job.dir / "two.pt").string()},
                                        {"--report", (job.dir / "two.json").string()}}));
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_LT(max_difference(parameters_of(job.dir / "one.pt"), parameters_of(job.dir / "two.pt")), 1e-5);

  auto report = testing::read_json(job.dir / "two.json");
  EXPECT_EQ(report["world_size"], 2);
  EXPECT_EQ(report["steps"], std::stoi(steps));
  EXPECT_EQ(report["evaluations"].back()["samples"], std::stoi(steps) * 32);  // both ranks' samples
  EXPECT_GT(report["communication"]["ms_per_step"].get<double>(), 0);
  const double hidden = report["communication"]["hidden_share"];
  EXPECT_GE(hidden, 0);
  EXPECT_LE(hidden, 1);
  // Evaluation splits the test set over the ranks and adds up: the same accuracy as one rank's.
  EXPECT_NEAR(report["test_accuracy"].get<double>(), testing::read_json(job.dir / "one.json")["test_accuracy"].get<double>(),
              1.0 / 256);
  EXPECT_TRUE(testing::Contains(two.out, "ranks              2, each with batch 16"));
}

INSTANTIATE_TEST_SUITE_P(Zoo, TwoRanksOfModel, ::testing::Values("cnn", "resnet"));

// Two network namespaces joined by a veth pair: two machines with their own addresses, as far
// as the ranks can tell. Removed with everything in them on destruction.
class TwoHosts {
 public:
  TwoHosts() : tag_(std::to_string(getpid() % 100000)), subnet_(fmt::format("10.231.{}", getpid() % 250)) {
    auto made = testing::run({"ip", "netns", "add", host(0)});
    if (made.exit_code != 0) {
      skip_reason_ = "cannot make network namespaces here: " + made.err;
      return;
    }
    created_ = true;
    for (const auto& command : std::vector<std::vector<std::string>>{
             {"ip", "netns", "add", host(1)},
             {"ip", "link", "add", link(0), "type", "veth", "peer", "name", link(1)},
             {"ip", "link", "set", link(0), "netns", host(0)},
             {"ip", "link", "set", link(1), "netns", host(1)},
             {"ip", "-n", host(0), "addr", "add", address(0) + "/24", "dev", link(0)},
             {"ip", "-n", host(1), "addr", "add", address(1) + "/24", "dev", link(1)},
             {"ip", "-n", host(0), "link", "set", link(0), "up"},
             {"ip", "-n", host(1), "link", "set", link(1), "up"},
             {"ip", "-n", host(0), "link", "set", "lo", "up"},
             {"ip", "-n", host(1), "link", "set", "lo", "up"}}) {
      auto result = testing::run(command);
      if (result.exit_code != 0) {
        skip_reason_ = "cannot link the network namespaces: " + result.err;
        return;
      }
    }
  }
  ~TwoHosts() {
    if (!created_) return;
    testing::run({"ip", "netns", "del", host(0)});
    testing::run({"ip", "netns", "del", host(1)});
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  const std::string& skip_reason() const { return skip_reason_; }
  std::string host(int i) const { return fmt::format("ab{}{}", i, tag_); }
  std::string address(int i) const { return fmt::format("{}.{}", subnet_, i + 1); }
  // `afterburner args` run inside host i.
  std::vector<std::string> on(int i, const std::vector<std::string>& args) const {
    std::vector<std::string> command{"ip", "netns", "exec", host(i), testing::cli_binary().string()};
    command.insert(command.end(), args.begin(), args.end());
    return command;
  }

 private:
  std::string link(int i) const { return fmt::format("vab{}{}", i, tag_); }
  std::string tag_, subnet_, skip_reason_;
  bool created_ = false;
};

// One rank on each of two hosts, training over the veth link with --nnodes 2, ends exactly where
// two ranks on one machine end.
TEST(TrainRanks, TwoHostsTrainOverTheirLinkAsTwoLocalRanksDo) {
  TwoHosts hosts;
  if (!hosts.skip_reason().empty()) GTEST_SKIP() << hosts.skip_reason();
  Job job;
  auto node = [&](int i) {
    return hosts.on(i, job.args({{"--nnodes", "2"}, {"--node-rank", std::to_string(i)},
                                 {"--master-addr", hosts.address(0)}, {"--master-port", "29500"},
                                 {"--dist-timeout", "30"}, {"--max-steps", "8"},
                                 {"--export", (job.dir / fmt::format("node{}.pt", i)).string()},
                                 {"--report", (job.dir / fmt::format("node{}.json", i)).string()}}));
  };
  auto second = std::async(std::launch::async, [&] { return testing::run(node(1)); });
  auto first = testing::run(node(0));
  auto second_result = second.get();
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(second_result.exit_code, 0) << second_result.err;
  EXPECT_EQ(testing::read_json(job.dir / "node0.json")["world_size"], 2);
  EXPECT_FALSE(fs::exists(job.dir / "node1.json")) << "only rank 0 reports";

  auto local = testing::run_cli(job.args({{"--nproc", "2"}, {"--max-steps", "8"},
                                          {"--export", (job.dir / "local.pt").string()}}));
  ASSERT_EQ(local.exit_code, 0) << local.err;
  EXPECT_EQ(max_difference(parameters_of(job.dir / "node0.pt"), parameters_of(job.dir / "local.pt")), 0);
}

// torchrun itself launching afterburner (its static rendezvous: every rank a client of the
// agent's store under /worker/attempt_0): the same bits as afterburner's own launcher.
TEST(TrainRanks, TorchrunLaunchesTheRanksAsOurLauncherDoes) {
  if (!fs::exists("/usr/bin/torchrun")) GTEST_SKIP() << "Debian's torchrun (python3-torch) is not installed";
  Job job;
  std::vector<std::string> command{"/usr/bin/torchrun", "--nproc_per_node", "2", "--no_python",
                                   // Debian's torchrun crashes under Python 3.11 without these (pytorch#92319).
                                   "--redirects", "1", "--tee", "1",
                                   "--master_port", std::to_string(free_port("127.0.0.1")),
                                   testing::cli_binary().string()};
  for (const auto& arg : job.args({{"--max-steps", "6"}, {"--export", (job.dir / "torchrun.pt").string()},
                                   {"--report", (job.dir / "torchrun.json").string()}})) {
    command.push_back(arg);
  }
  auto launched = testing::run(command);
  ASSERT_EQ(launched.exit_code, 0) << launched.err;
  EXPECT_EQ(testing::read_json(job.dir / "torchrun.json")["world_size"], 2);
  auto ours = testing::run_cli(job.args({{"--nproc", "2"}, {"--max-steps", "6"},
                                         {"--export", (job.dir / "ours.pt").string()}}));
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  EXPECT_EQ(max_difference(parameters_of(job.dir / "torchrun.pt"), parameters_of(job.dir / "ours.pt")), 0);
}

TEST(TrainRanks, ResumeWithTheSameRanksContinuesExactly) {
  Job job;
  auto straight = testing::run_cli(job.args({{"--nproc", "2"}, {"--max-steps", "10"},
                                             {"--export", (job.dir / "straight.pt").string()}}));
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::string checkpoints = (job.dir / "checkpoints").string();
  auto first = testing::run_cli(job.args({{"--nproc", "2"}, {"--max-steps", "5"}, {"--checkpoint-dir", checkpoints},
                                          {"--checkpoint-every", "5"}}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto resumed = testing::run_cli(job.args({{"--nproc", "2"}, {"--max-steps", "10"}, {"--checkpoint-dir", checkpoints},
                                            {"--resume", ""}, {"--export", (job.dir / "resumed.pt").string()}}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(max_difference(parameters_of(job.dir / "straight.pt"), parameters_of(job.dir / "resumed.pt")), 0);
  // Another rank count would read other shards from the same position: refused.
  auto alone = testing::run_cli(job.args({{"--max-steps", "12"}, {"--checkpoint-dir", checkpoints}, {"--resume", ""}}));
  EXPECT_TRUE(testing::fails_with(alone, 1, {"checkpoint.pt: was written by a run of 2 rank(s) and this run has 1"}));
}

// Starts `--nproc 2` on `job`, sends `signal` to rank 1 once the job has trained a few seconds,
// and returns how the job ended and how many seconds it ran after the signal: the bound these
// tests check is that the job stops instead of waiting for a rank that is gone, not how fast
// processes start. It waits for the first step's progress line rather than a fixed time: on a
// loaded machine rank 1 could still be joining the job, and rank 0 then fails to join instead of
// seeing rank 1 stop answering. The progress lines are kept out of the job's stderr the test reads.
std::pair<CommandResult, double> signal_rank_1(const Job& job, const std::string& signal, const std::string& timeout) {
  std::vector<std::string> command{testing::cli_binary().string()};
  for (const auto& arg :
       job.args({{"--nproc", "2"}, {"--epochs", "500"}, {"--dist-timeout", timeout}, {"--progress", "log"}})) {
    command.push_back(arg);
  }
  const std::string script = R"script(
signal=$1; shift
log=$(mktemp)
"$@" 2> >(tee "$log" | grep -v '^epoch ' >&2) & launcher=$!
for i in $(seq 100); do
  for child in $(cat /proc/$launcher/task/*/children 2>/dev/null); do
    tr '\0' '\n' < /proc/$child/environ 2>/dev/null | grep -qx RANK=1 && rank1=$child
  done
  [ -n "$rank1" ] && break; sleep 0.1
done
for i in $(seq 600); do grep -q ' step [0-9]' "$log" && break; sleep 0.1; done
sleep 2; kill -$signal $rank1; signalled=$EPOCHREALTIME
wait $launcher; status=$?
echo "seconds after the signal: $(awk "BEGIN { print $EPOCHREALTIME - $signalled }")"
rm -f "$log"; exit $status)script";
  std::vector<std::string> argv{"bash", "-c", script, "job", signal};
  argv.insert(argv.end(), command.begin(), command.end());
  auto result = testing::run(argv);
  const std::string marker = "seconds after the signal: ";
  const auto at = result.out.rfind(marker);
  EXPECT_NE(at, std::string::npos) << result.out;
  const double seconds = at == std::string::npos ? 1e9 : std::stod(result.out.substr(at + marker.size()));
  return {result, seconds};
}

void expect_one_line_each(const CommandResult& result) {
  for (const auto& line : testing::error_lines(result.err)) EXPECT_EQ(line.rfind("afterburner: ", 0), 0u) << line;
}

// SIGKILL of rank 1 mid-training: rank 0 fails in its next collective naming rank 1, and so does
// the launcher, well within the timeout.
TEST(TrainRanks, KilledRankStopsTheJobNamingIt) {
  Job job;
  auto [result, seconds] = signal_rank_1(job, "KILL", "60");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_LT(seconds, 30) << "the job took as long as the timeout to stop";
  EXPECT_TRUE(testing::Contains(result.err, "afterburner: rank 1 (pid ")) << result.err;
  EXPECT_TRUE(testing::Contains(result.err, "was killed by signal 9")) << result.err;
  EXPECT_TRUE(testing::Contains(result.err, "afterburner: rank 0: training stopped: rank 1 stopped answering (")) << result.err;
  expect_one_line_each(result);
}

// SIGSTOP of rank 1: it neither dies nor answers. Rank 0 fails once --dist-timeout has passed,
// naming it; the launcher then ends the stalled rank instead of waiting for it.
TEST(TrainRanks, StalledRankStopsTheJobAfterTheTimeoutNamingIt) {
  Job job;
  auto [result, seconds] = signal_rank_1(job, "STOP", "5");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_LT(seconds, 5 + 3 + 10 + 5 + 10) << "timeout, heartbeat check, grace, kill, and slack";
  EXPECT_TRUE(testing::Contains(result.err, "afterburner: rank 0: training stopped: rank 1 stopped answering (")) << result.err;
  expect_one_line_each(result);
}

TEST(TrainRanks, JobsThatCannotRunFailAtStartWithOneLine) {
  Job job;
  EXPECT_TRUE(testing::fails_with(testing::run_cli(job.args({{"--nproc", "2"}, {"--batch-size", "33"}})), 2,
                                  {"--batch-size", "must divide evenly over the 2 ranks, got 33"}));
  EXPECT_TRUE(testing::fails_with(testing::run_cli(job.args({{"--nnodes", "2"}, {"--node-rank", "2"}})), 2,
                                  {"--node-rank", "must be below --nnodes 2, got 2"}));
  EXPECT_TRUE(testing::fails_with(testing::run_cli(job.args({{"--nproc", "2"}, {"--master-port", "70000"}})), 2,
                                  {"--master-port", "must be at most 65535"}));
  EXPECT_TRUE(testing::fails_with(testing::run_cli(job.args({{"--nproc", "2"}, {"--master-addr", "not-an-address"}})),
                                  2, {"--master-addr", "'not-an-address' is not an IPv4 address"}));
  // A port someone listens on: the launcher refuses it before starting any rank.
  Listener taken;
  const std::string port = std::to_string(taken.port());
  EXPECT_TRUE(testing::fails_with(testing::run_cli(job.args({{"--nproc", "2"}, {"--master-port", port}})), 1,
                                  {"127.0.0.1:" + port + ": the rendezvous port is already in use"}));
}

}  // namespace
}  // namespace afterburner::dist
