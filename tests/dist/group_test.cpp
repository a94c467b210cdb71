// Joining a job on c10d's TCPStore and ProcessGroupGloo: with a Python torch.distributed rank
// (real processes, one group), torchrun's variables, and the errors a job can meet at start.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <future>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "afterburner/dist/group.h"
#include "afterburner/dist/launch.h"
#include "fixtures.h"
#include "testing.h"

namespace afterburner::dist {
namespace {



GroupOptions two_ranks(int port, int64_t rank) {
  return GroupOptions().master_port(port).rank(rank).world_size(2).timeout(std::chrono::seconds(30));
}

// The C++ rank takes rank GetParam(), a Python process the other; both sum arange(4) + 10 * rank
// and receive rank 0's 7, 8, 9.
class WithPython : public ::testing::TestWithParam<int64_t> {};

TEST_P(WithPython, AllreduceAndBroadcastInOneGroup) {
  const int port = free_port("127.0.0.1");
  const int64_t ours = GetParam(), theirs = 1 - ours;
  auto python = std::async(std::launch::async, [&] {
    return testing::run({"/usr/bin/python3", (testing::source_dir() / "tests/dist/python_peer.py").string(), "--port",
                         std::to_string(port), "--rank", std::to_string(theirs), "--world-size", "2"});
  });
  Group group = join_group(two_ranks(port, ours));
  EXPECT_EQ(group.rank, ours);
  EXPECT_EQ(group.world_size, 2);
  std::vector<torch::Tensor> summed{torch::arange(4, torch::kFloat) + 10.0 * double(ours)};
  group.process_group->allreduce(summed)->wait();
  std::vector<torch::Tensor> received{ours == 0 ? torch::tensor({7.0f, 8.0f, 9.0f}) : torch::zeros({3})};
  c10d::BroadcastOptions from_rank_0;
  from_rank_0.rootRank = 0;
  group.process_group->broadcast(received, from_rank_0)->wait();

  const auto expected_sum = 2 * torch::arange(4, torch::kFloat) + 10;
  EXPECT_TRUE(torch::equal(summed[0], expected_sum)) << summed[0];
  EXPECT_TRUE(torch::equal(received[0], torch::tensor({7.0f, 8.0f, 9.0f}))) << received[0];
  auto result = python.get();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto printed = nlohmann::json::parse(result.out);
  EXPECT_EQ(printed.at("allreduce").get<std::vector<float>>(), std::vector<float>({10, 12, 14, 16}));
  EXPECT_EQ(printed.at("broadcast").get<std::vector<float>>(), std::vector<float>({7, 8, 9}));
}

INSTANTIATE_TEST_SUITE_P(Dist, WithPython, ::testing::Values(0, 1), [](const auto& info) {
  return info.param == 0 ? std::string("AfterburnerServesTheStore") : std::string("PythonServesTheStore");
});

TEST(Group, ASingleRankJobSumsToItself) {
  Group group = join_group(GroupOptions().master_port(free_port("127.0.0.1")).world_size(1));
  std::vector<torch::Tensor> tensors{torch::arange(5, torch::kFloat)};
  group.process_group->allreduce(tensors)->wait();
  EXPECT_TRUE(torch::equal(tensors[0], torch::arange(5, torch::kFloat)));
}

// Gloo's writes to a dead rank must come back as an error it can throw, not a SIGPIPE that ends
// the process without a word.
TEST(Group, AWriteToAClosedSocketFailsInsteadOfKillingTheProcess) {
  signal(SIGPIPE, SIG_DFL);
  Group group = join_group(GroupOptions().master_port(free_port("127.0.0.1")).world_size(1));
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sockets), 0);
  close(sockets[1]);
  const char byte = 0;
  EXPECT_EQ(write(sockets[0], &byte, 1), -1);
  EXPECT_EQ(errno, EPIPE);
  close(sockets[0]);
}

TEST(Group, ARankOutsideTheWorldIsAUsageErrorNamingIt) {
  auto message = testing::error_message<UsageError>([] { join_group(GroupOptions().rank(2).world_size(2)); });
  EXPECT_TRUE(testing::Contains(message, "rank: 2 is outside a world of 2"));
  EXPECT_THROW(join_group(GroupOptions().master_port(70000)), UsageError);
  EXPECT_THROW(join_group(GroupOptions().world_size(0)), UsageError);
}

TEST(Group, APortInUseIsOneClearLine) {
  Listener taken;
  auto message = testing::error_message<DistError>([&] { join_group(GroupOptions().master_port(taken.port())); });
  EXPECT_TRUE(testing::Contains(message, fmt::format("127.0.0.1:{}", taken.port())));
  EXPECT_TRUE(testing::Contains(message, "already in use"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

// A peer that never comes ends the wait after the timeout (ctest's own limit catches a hang), with
// the address and the timeout in the message.
TEST(Group, AJobThatDoesNotAssembleFailsAfterTheTimeout) {
  auto message = testing::error_message<DistError>([] {
    join_group(GroupOptions().master_port(free_port("127.0.0.1")).world_size(2).timeout(std::chrono::seconds(2)));
  });
  EXPECT_TRUE(testing::Contains(message, "127.0.0.1:"));
  EXPECT_TRUE(testing::Contains(message, "within 2 s"));
}

// Scoped environment variables.
TEST(Group, TorchrunsVariablesGiveTheOptions) {
  {
    ScopedEnvironment none;
    EXPECT_FALSE(options_from_environment().has_value());
  }
  ScopedEnvironment env;
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "10.0.0.7");
  env.set("MASTER_PORT", "29400");
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  env.set("TORCHELASTIC_RESTART_COUNT", "2");
  auto options = options_from_environment();
  ASSERT_TRUE(options.has_value());
  EXPECT_EQ(options->rank(), 1);
  EXPECT_EQ(options->world_size(), 4);
  EXPECT_EQ(options->master_addr(), "10.0.0.7");
  EXPECT_EQ(options->master_port(), 29400);
  EXPECT_TRUE(options->agent_store());
  EXPECT_EQ(options->restart_count(), 2);
  env.set("RANK", "one");
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([] { options_from_environment(); }), "RANK: expected an integer"));
  env.set("RANK", "4");
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([] { options_from_environment(); }), "outside a world of 4"));
}

}  // namespace
}  // namespace afterburner::dist
