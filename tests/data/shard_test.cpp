// Data-parallel shards: the same indices as torch.utils.data.DistributedSampler (Python, run
// here), disjoint shards covering the epoch, and ranks' batches that together are the batches
// of one process with the ranks' total batch size.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "afterburner/core/error.h"
#include "afterburner/data/loader.h"
#include "testing.h"

namespace afterburner::data {
namespace {

struct Case {
  int64_t size, count;
  bool shuffle, drop_uneven;
  uint64_t seed;
  int64_t epoch;
};

// Every rank's indices of every case, from Python's DistributedSampler, as JSON lists.
nlohmann::json python_indices(const std::vector<Case>& cases) {
  std::string calls;
  for (const auto& c : cases) {
    calls += fmt::format("run({}, {}, {}, {}, {}, {})\n", c.size, c.count, c.shuffle ? "True" : "False",
                         c.drop_uneven ? "True" : "False", c.seed, c.epoch);
  }
  auto result = testing::run(
      {"/usr/bin/python3", "-c",
       "import json\nfrom torch.utils.data import DistributedSampler\nout = []\n"
       "def run(n, count, shuffle, drop, seed, epoch):\n"
       "    ranks = []\n"
       "    for rank in range(count):\n"
       "        s = DistributedSampler(range(n), num_replicas=count, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop)\n"
       "        s.set_epoch(epoch)\n"
       "        ranks.append(list(s))\n"
       "    out.append(ranks)\n" +
           calls + "print(json.dumps(out))\n"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return nlohmann::json::parse(result.out);
}

TEST(Shard, IndicesEqualTorchsDistributedSampler) {
  const std::vector<Case> cases{{10, 3, true, false, 0, 0},  {10, 3, true, true, 0, 0},   {10, 3, false, false, 0, 0},
                                {1, 4, true, false, 7, 2},   {5, 2, true, false, 42, 1},  {60000, 2, true, false, 0, 3},
                                {1001, 4, true, true, 9, 0}, {7, 7, false, true, 0, 0}};
  const auto expected = python_indices(cases);
  ASSERT_EQ(expected.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    for (int64_t rank = 0; rank < c.count; ++rank) {
      auto shard = Shard().rank(rank).count(c.count).drop_uneven(c.drop_uneven);
      auto ours = sharded_order(c.size, shard, c.shuffle, c.seed, c.epoch);
      std::vector<int64_t> indices(ours.data_ptr<int64_t>(), ours.data_ptr<int64_t>() + ours.numel());
      EXPECT_EQ(indices, expected[i][rank].get<std::vector<int64_t>>()) << "case " << i << " rank " << rank;
    }
  }
}

TEST(Shard, ShardsAreDisjointAndCoverTheEpoch) {
  const int64_t size = 1000, count = 3;
  std::vector<int64_t> seen(size, 0);
  for (int64_t rank = 0; rank < count; ++rank) {
    auto order = sharded_order(size, Shard().rank(rank).count(count).drop_uneven(true), true, 5, 1);
    EXPECT_EQ(order.numel(), size / count);
    for (int64_t i = 0; i < order.numel(); ++i) ++seen[order[i].item<int64_t>()];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), size / count * count);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), size % count);
  // Another epoch, another order.
  EXPECT_FALSE(torch::equal(sharded_order(size, Shard(), true, 5, 1), sharded_order(size, Shard(), true, 5, 2)));
}

// Rank r's batch b of 64 holds the samples of positions r, r + 2, ... of the single process's
// batch b of 128: the two ranks' batches are its batch, split.
TEST(Shard, TwoRanksBatchesMakeOneProcesssBatches) {
  auto dataset = std::make_shared<TensorDataset>(torch::zeros({1000, 1}), torch::arange(1000));
  auto options = LoaderOptions().workers(0).seed(3);
  Loader whole(dataset, LoaderOptions(options).batch_size(128).shard(Shard()));
  Loader rank0(dataset, LoaderOptions(options).batch_size(64).shard(Shard().rank(0).count(2)));
  Loader rank1(dataset, LoaderOptions(options).batch_size(64).shard(Shard().rank(1).count(2)));
  ASSERT_EQ(rank0.batches_per_epoch(), whole.batches_per_epoch());
  std::vector<torch::Tensor> halves;
  for (auto* loader : {&rank0, &rank1}) {
    std::vector<torch::Tensor> targets;
    for (auto& batch : loader->epoch(1)) targets.push_back(batch.target);
    halves.push_back(torch::stack(targets));
  }
  std::vector<torch::Tensor> expected;
  for (auto& batch : whole.epoch(1)) expected.push_back(batch.target);
  auto interleaved = torch::stack({halves[0], halves[1]}, /*dim=*/2).reshape({int64_t(expected.size()), 128});
  EXPECT_TRUE(torch::equal(interleaved, torch::stack(expected)));
}

TEST(Shard, ARankOutsideTheCountIsAUsageError) {
  EXPECT_TRUE(testing::Contains(
      testing::error_message<UsageError>([] { sharded_order(10, Shard().rank(2).count(2), true, 0, 0); }),
      "rank 2 is outside 2 shards"));
  EXPECT_THROW(sharded_order(10, Shard().count(0), true, 0, 0), UsageError);
  // A loader checks its shard before it divides by the count, and counts the shard's samples.
  auto dataset = std::make_shared<TensorDataset>(torch::zeros({100, 1}), torch::arange(100));
  EXPECT_THROW(Loader(dataset, LoaderOptions().workers(0).shard(Shard().count(0))), UsageError);
  EXPECT_TRUE(testing::Contains(
      testing::error_message<UsageError>(
          [&] { Loader(dataset, LoaderOptions().workers(0).batch_size(64).shard(Shard().rank(1).count(2))); }),
      "64 with 50 samples and drop_last gives no batch per epoch"));
}

}  // namespace
}  // namespace afterburner::data
