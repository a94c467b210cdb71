// sync_batch_norm on two real ranks, each holding half of one batch, against LibTorch's
// BatchNorm on the whole batch in double precision: outputs, input gradients, the ranks'
// weight and bias gradients summed, and the running statistics.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include "afterburner/dist/group.h"
#include "afterburner/dist/launch.h"
#include "afterburner/dist/sync_batch_norm.h"
#include "fixtures.h"
#include "testing.h"

namespace afterburner::dist {
namespace {

constexpr double kMomentum = 0.1, kEps = 1e-5;

// The whole batch (odd sizes: 6 samples of 3 channels, 5x7), the loss's weights and the layer.
struct Problem {
  torch::Tensor x, loss_weights, weight, bias;
  explicit Problem(torch::ScalarType dtype) {
    auto generator = at::detail::createCPUGenerator(7);
    x = (torch::randn({6, 3, 5, 7}, generator) * 3 + 1).to(dtype);
    loss_weights = torch::randn({6, 3, 5, 7}, generator).to(dtype);
    weight = torch::randn({3}, generator).to(dtype);
    bias = torch::randn({3}, generator).to(dtype);
  }
};

// One rank's half (rows 3 rank .. 3 rank + 2): what it computes and the gradients it gets.
struct Outcome {
  torch::Tensor y, dx, dweight, dbias, running_mean, running_var;
  std::vector<torch::Tensor> all() const { return {y, dx, dweight, dbias, running_mean, running_var}; }
};

// The body of one rank, run by the parent test in a process of its own.
TEST(SyncBatchNormRank, Computes) {
  const char* rank_text = std::getenv("AFTERBURNER_TEST_RANK");
  if (rank_text == nullptr) GTEST_SKIP() << "a rank of SyncBatchNorm's tests, started by them";
  const int64_t rank = std::stoi(rank_text);
  auto group = join_group(GroupOptions().master_port(std::stoi(std::getenv("AFTERBURNER_TEST_PORT"))).rank(rank).world_size(2));
  Problem problem(torch::kFloat);
  auto x = problem.x.slice(0, 3 * rank, 3 * rank + 3).clone().requires_grad_();
  auto weight = problem.weight.clone().requires_grad_(), bias = problem.bias.clone().requires_grad_();
  auto running_mean = torch::zeros({3}), running_var = torch::ones({3});
  const auto x_before = x.detach().clone(), weight_before = weight.detach().clone(), bias_before = bias.detach().clone();
  auto y = sync_batch_norm(x, weight, bias, running_mean, running_var, kMomentum, kEps, group.process_group);
  (y * problem.loss_weights.slice(0, 3 * rank, 3 * rank + 3)).sum().backward();
  // A second call sees the same batch statistics, so the same output.
  auto again = sync_batch_norm(x.detach(), weight.detach(), bias.detach(), running_mean.clone(), running_var.clone(),
                               kMomentum, kEps, group.process_group);
  EXPECT_TRUE(torch::equal(again, y.detach()));
  EXPECT_TRUE(torch::equal(x.detach(), x_before)) << "the input was written to";
  EXPECT_TRUE(torch::equal(weight.detach(), weight_before) && torch::equal(bias.detach(), bias_before))
      << "the weight or bias was written to";
  Outcome outcome{y.detach(), x.grad(), weight.grad(), bias.grad(), running_mean, running_var};
  torch::save(outcome.all(), std::getenv("AFTERBURNER_TEST_OUTPUT"));
}

TEST(SyncBatchNorm, TwoRanksComputeBatchNormOfTheWholeBatch) {
  testing::TempDir dir;
  auto results = run_ranks("SyncBatchNormRank.Computes", [&](int rank) {
    return std::vector<std::string>{fmt::format("AFTERBURNER_TEST_OUTPUT={}", (dir / fmt::format("rank{}.pt", rank)).string())};
  });
  for (const auto& result : results) ASSERT_EQ(result.exit_code, 0) << result.out << result.err;

  Problem problem(torch::kDouble);
  auto x = problem.x.clone().requires_grad_();
  auto weight = problem.weight.clone().requires_grad_(), bias = problem.bias.clone().requires_grad_();
  auto running_mean = torch::zeros({3}, torch::kDouble), running_var = torch::ones({3}, torch::kDouble);
  auto y = torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true, kMomentum, kEps, false);
  (y * problem.loss_weights).sum().backward();

  std::vector<torch::Tensor> ranks[2];
  for (int rank = 0; rank < 2; ++rank) torch::load(ranks[rank], (dir / fmt::format("rank{}.pt", rank)).string());
  auto close = [](const torch::Tensor& ours, const torch::Tensor& reference) {
    return torch::allclose(ours.to(torch::kDouble), reference, /*rtol=*/1e-5, /*atol=*/1e-5);
  };
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(close(ranks[rank][0], y.detach().slice(0, 3 * rank, 3 * rank + 3))) << "output, rank " << rank;
    EXPECT_TRUE(close(ranks[rank][1], x.grad().slice(0, 3 * rank, 3 * rank + 3))) << "input gradient, rank " << rank;
    EXPECT_TRUE(close(ranks[rank][4], running_mean)) << "running mean, rank " << rank;
    EXPECT_TRUE(close(ranks[rank][5], running_var)) << "running variance, rank " << rank;
  }
  EXPECT_TRUE(close(ranks[0][2] + ranks[1][2], weight.grad())) << "weight gradient";
  EXPECT_TRUE(close(ranks[0][3] + ranks[1][3], bias.grad())) << "bias gradient";
}

}  // namespace
}  // namespace afterburner::dist
