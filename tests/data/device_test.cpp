#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/data/device.h"

namespace afterburner::data {
namespace {

TEST(ToDevice, CpuIsTheIdentity) {
  Batch batch{torch::rand({4, 3}), torch::arange(4)};
  Batch moved = to_device(batch, torch::kCPU);
  EXPECT_EQ(moved.input.data_ptr(), batch.input.data_ptr());
  EXPECT_EQ(moved.target.data_ptr(), batch.target.data_ptr());
}

TEST(Prefetcher, YieldsTheEpochInOrder) {
  auto dataset = std::make_shared<TensorDataset>(torch::rand({50, 2}), torch::arange(50));
  Loader loader(dataset, LoaderOptions().batch_size(8).drop_last(false));
  std::vector<Batch> expected;
  for (Batch& batch : loader.epoch(1)) expected.push_back(batch);

  Prefetcher prefetcher(loader.epoch(1), torch::kCPU);
  size_t i = 0;
  for (Batch& batch : prefetcher) {
    ASSERT_LT(i, expected.size());
    EXPECT_TRUE(torch::equal(batch.input, expected[i].input));
    EXPECT_TRUE(torch::equal(batch.target, expected[i].target));
    ++i;
  }
  EXPECT_EQ(i, expected.size());
}

TEST(Prefetcher, EmptyAndSingleBatchEpochs) {
  auto dataset = std::make_shared<TensorDataset>(torch::rand({16, 2}), torch::arange(16));
  Loader loader(dataset, LoaderOptions().batch_size(8));
  Prefetcher empty(loader.epoch(0, 2), torch::kCPU);
  EXPECT_TRUE(empty.begin() == empty.end());
  Prefetcher single(loader.epoch(0, 1), torch::kCPU);
  int count = 0;
  for (Batch& batch : single) count += batch.target.size(0) == 8;
  EXPECT_EQ(count, 1);
}

}  // namespace
}  // namespace afterburner::data
