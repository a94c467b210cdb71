#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "afterburner/core/error.h"
#include "afterburner/data/loader.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

// Sample i has target i and an 8x8 uint8 image, so batches show which samples they hold.
DatasetPtr numbered_images(int64_t size) {
  torch::Generator generator = at::detail::createCPUGenerator(3);
  return std::make_shared<TensorDataset>(torch::randint(0, 256, {size, 1, 8, 8}, generator, torch::kByte),
                                         torch::arange(size));
}

TransformPtr augmentation() {
  return compose({to_float(1.0 / 255), normalize({0.3}, {0.3}), random_crop(2), random_horizontal_flip(0.5)});
}

std::vector<Batch> collect(Loader& loader, int64_t epoch, int64_t start_batch = 0) {
  std::vector<Batch> batches;
  for (Batch& batch : loader.epoch(epoch, start_batch)) batches.push_back(batch);
  return batches;
}

torch::Tensor targets_of(const std::vector<Batch>& batches) {
  std::vector<torch::Tensor> targets;
  for (const Batch& batch : batches) targets.push_back(batch.target);
  return torch::cat(targets);
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].target, b[i].target)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].input, b[i].input)) << "batch " << i;
  }
}

class LoaderWorkers : public ::testing::TestWithParam<int> {
 protected:
  LoaderOptions options() const { return LoaderOptions().batch_size(10).workers(GetParam()).prefetch(2).seed(5); }
};

TEST_P(LoaderWorkers, EveryIndexOncePerEpochWithoutDropLast) {
  Loader loader(numbered_images(103), options().drop_last(false));
  ASSERT_EQ(loader.batches_per_epoch(), 11);
  for (int64_t epoch : {0, 1}) {
    auto batches = collect(loader, epoch);
    ASSERT_EQ(batches.size(), 11u);
    for (size_t i = 0; i < 10; ++i) EXPECT_EQ(batches[i].target.size(0), 10);
    EXPECT_EQ(batches[10].target.size(0), 3);
    auto [sorted, order] = targets_of(batches).sort();
    EXPECT_TRUE(torch::equal(sorted, torch::arange(103)));
  }
}

TEST_P(LoaderWorkers, DropLastLeavesOutThePartialBatch) {
  Loader loader(numbered_images(103), options());
  ASSERT_EQ(loader.batches_per_epoch(), 10);
  auto batches = collect(loader, 0);
  ASSERT_EQ(batches.size(), 10u);
  auto targets = targets_of(batches);
  EXPECT_EQ(std::get<0>(torch::_unique(targets)).size(0), 100);
  for (const Batch& batch : batches) {
    EXPECT_EQ(batch.input.sizes(), (std::vector<int64_t>{10, 1, 8, 8}));
    EXPECT_TRUE(batch.input.is_contiguous());
    EXPECT_TRUE(batch.target.is_contiguous());
    EXPECT_EQ(batch.target.scalar_type(), torch::kLong);
  }
}

TEST_P(LoaderWorkers, BatchesMatchTheSingleThreadedLoader) {
  auto dataset = numbered_images(250);
  Loader reference(dataset, options().workers(0), augmentation());
  Loader loader(dataset, options(), augmentation());
  for (int64_t epoch : {0, 3}) expect_same_batches(collect(loader, epoch), collect(reference, epoch));
}

TEST_P(LoaderWorkers, ResumeYieldsTheTailOfTheEpoch) {
  auto dataset = numbered_images(95);
  Loader loader(dataset, options(), augmentation());
  auto whole = collect(loader, 2);
  auto tail = collect(loader, 2, 6);
  expect_same_batches(tail, std::vector<Batch>(whole.begin() + 6, whole.end()));
  EXPECT_TRUE(collect(loader, 2, loader.batches_per_epoch()).empty());
}

TEST_P(LoaderWorkers, ReportsTheBatchIndex) {
  Loader loader(numbered_images(50), options());
  auto range = loader.epoch(0, 2);
  int64_t expected = 2;
  for (auto it = range.begin(); it != range.end(); ++it) EXPECT_EQ(range.batch_index(), expected++);
  EXPECT_EQ(expected, 5);
}

// Throws for the batch holding sample `poisoned` while armed.
class Poison : public BatchTransform {
 public:
  explicit Poison(int64_t poisoned) : poisoned_(poisoned) {}
  Batch operator()(Batch batch, uint64_t) const override {
    if (armed && (batch.target == poisoned_).any().item<bool>()) {
      throw DataError("poisoned.idx", "sample " + std::to_string(poisoned_));
    }
    return batch;
  }
  mutable std::atomic<bool> armed{true};

 private:
  int64_t poisoned_;
};

TEST_P(LoaderWorkers, WorkerExceptionsReachTheConsumerUnchanged) {
  auto poison = std::make_shared<Poison>(42);
  Loader loader(numbered_images(100), options().shuffle(false), poison);
  int64_t delivered = 0;
  auto message = error_message<DataError>([&] {
    for (Batch& batch : loader.epoch(0)) delivered += batch.target.size(0) > 0;
  });
  EXPECT_EQ(message, "poisoned.idx: sample 42");
  EXPECT_EQ(delivered, 4);  // batches 0-3 come before the one holding sample 42

  // The failed batch ends its epoch.
  auto range = loader.epoch(0, 3);
  auto it = range.begin();
  EXPECT_THROW(++it, DataError);
  EXPECT_TRUE(it == range.end());
  poison->armed = false;
  EXPECT_EQ(collect(loader, 1).size(), 10u);
}

TEST_P(LoaderWorkers, AbandonedEpochsDoNotHang) {
  auto dataset = numbered_images(1000);
  Loader loader(dataset, options(), augmentation());
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    auto range = loader.epoch(epoch);
    auto it = range.begin();
    ++it;
  }
  expect_same_batches(collect(loader, 7), collect(loader, 7));
}

TEST_P(LoaderWorkers, DestroyedMidEpoch) {
  auto loader = std::make_unique<Loader>(numbered_images(1000), options(), augmentation());
  auto range = loader->epoch(0);
  auto it = range.begin();
  ++it;
  loader.reset();
  auto message = error_message<UsageError>([&] { ++it; });
  EXPECT_TRUE(Contains(message, "loader: was destroyed"));
}

TEST_P(LoaderWorkers, ANewEpochSupersedesTheOldOne) {
  Loader loader(numbered_images(200), options(), augmentation());
  auto expected = collect(loader, 1);
  auto old = loader.epoch(0);
  auto it = old.begin();
  auto fresh = collect(loader, 1);
  expect_same_batches(fresh, expected);
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { ++it; }), "epoch 0 was superseded"));
}

INSTANTIATE_TEST_SUITE_P(Workers, LoaderWorkers, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "workers" + std::to_string(info.param); });

TEST(Loader, OrderDependsOnSeedAndEpochOnly) {
  auto dataset = numbered_images(300);
  auto options = LoaderOptions().batch_size(300).workers(1);
  Loader loader(dataset, options);
  auto epoch0 = targets_of(collect(loader, 0));
  EXPECT_TRUE(torch::equal(epoch0, targets_of(collect(loader, 0))));
  EXPECT_FALSE(torch::equal(epoch0, targets_of(collect(loader, 1))));
  EXPECT_FALSE(torch::equal(epoch0, torch::arange(300)));
  Loader other_seed(dataset, LoaderOptions(options).seed(1));
  EXPECT_FALSE(torch::equal(epoch0, targets_of(collect(other_seed, 0))));
  // The global torch generator plays no part.
  torch::manual_seed(123);
  Loader again(dataset, options);
  torch::rand({10});
  EXPECT_TRUE(torch::equal(epoch0, targets_of(collect(again, 0))));
}

// Samples whose storage is in blocks of 7 (the last one shorter), as a pack's records in 4 MiB.
class BlockedImages : public TensorDataset {
 public:
  explicit BlockedImages(int64_t size)
      : TensorDataset(torch::zeros({size, 1, 2, 2}, torch::kByte), torch::arange(size)) {}
  torch::Tensor storage_blocks() const override { return torch::arange(size()).div(7, "floor"); }
};

TEST(BlockLocalOrder, VisitsAWindowOfBlocksAtATimeEverySampleOnce) {
  const auto dataset = std::make_shared<BlockedImages>(100);  // 15 blocks
  const torch::Tensor blocks = dataset->storage_blocks();
  for (int64_t window : {1, 3, 4, 20}) {
    const torch::Tensor order = block_local_order(blocks, window, 9);
    EXPECT_TRUE(torch::equal(std::get<0>(order.sort()), torch::arange(100))) << window;
    // Each run of a window's samples holds `window` whole blocks (the last run what is left).
    std::set<int64_t> seen_blocks;
    int64_t position = 0;
    while (position < 100) {
      std::set<int64_t> run;
      int64_t end = position;
      while (end < 100 && (run.size() < static_cast<size_t>(window) || run.count(blocks[order[end]].item<int64_t>()))) {
        run.insert(blocks[order[end]].item<int64_t>());
        ++end;
      }
      for (int64_t b : run) EXPECT_TRUE(seen_blocks.insert(b).second) << "block " << b << " met twice, window " << window;
      position = end;
    }
    EXPECT_EQ(seen_blocks.size(), 15u);
    EXPECT_TRUE(torch::equal(order, block_local_order(blocks, window, 9)));
    EXPECT_FALSE(torch::equal(order, block_local_order(blocks, window, 10)));
  }
  // A window of one block keeps its samples together, in a shuffled order within.
  const torch::Tensor single = block_local_order(blocks, 1, 9);
  EXPECT_FALSE(torch::equal(single, std::get<0>(single.sort())));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { block_local_order(blocks, 0, 1); }), "block_window"));
}

TEST(Loader, BlockLocalShufflesByTheDatasetsBlocks) {
  const auto dataset = std::make_shared<BlockedImages>(98);  // 14 whole blocks
  const auto options = LoaderOptions().batch_size(10).drop_last(false).workers(2).seed(4).block_local(true).block_window(2);
  Loader loader(dataset, options);
  const torch::Tensor epoch0 = targets_of(collect(loader, 0));
  EXPECT_TRUE(torch::equal(std::get<0>(epoch0.sort()), torch::arange(98)));
  // The first 14 samples are two whole blocks.
  const torch::Tensor first_blocks = std::get<0>(at::_unique(epoch0.slice(0, 0, 14).div(7, "floor")));
  EXPECT_EQ(first_blocks.size(0), 2);
  EXPECT_TRUE(torch::equal(epoch0, targets_of(collect(loader, 0))));
  EXPECT_FALSE(torch::equal(epoch0, targets_of(collect(loader, 1))));
  // Without blocks, the option changes nothing: a full shuffle.
  Loader plain(numbered_images(100), options);
  Loader full(numbered_images(100), LoaderOptions(options).block_local(false));
  EXPECT_TRUE(torch::equal(targets_of(collect(plain, 0)), targets_of(collect(full, 0))));
}

TEST(Loader, BlockLocalShardsAreEveryRanksShareOfOneBlockLocalOrder) {
  const auto dataset = std::make_shared<BlockedImages>(95);  // 14 blocks, the last of 4 samples
  const auto options = LoaderOptions().batch_size(8).drop_last(false).workers(1).seed(4).block_local(true).block_window(2);
  Loader unsharded(dataset, options);
  const torch::Tensor whole = targets_of(collect(unsharded, 3));
  std::vector<torch::Tensor> shards;
  for (int64_t rank = 0; rank < 3; ++rank) {
    Loader loader(dataset, LoaderOptions(options).shard(Shard().rank(rank).count(3)));
    shards.push_back(targets_of(collect(loader, 3)));
    EXPECT_EQ(shards.back().size(0), 32);  // 95 padded to 96 by the order's first sample
    EXPECT_TRUE(torch::equal(shards.back(), shard_of(whole, Shard().rank(rank).count(3))));
  }
  const torch::Tensor together = torch::stack(shards, 1).flatten();  // position i of the order: rank i % 3
  EXPECT_TRUE(torch::equal(together.slice(0, 0, 95), whole));
  EXPECT_EQ(together[95].item<int64_t>(), whole[0].item<int64_t>());
  // A window of 2 blocks (14 samples) at a time: the ranks' first 4 samples come from 2 blocks.
  EXPECT_LE(std::get<0>(at::_unique(torch::cat({shards[0].slice(0, 0, 4), shards[1].slice(0, 0, 4)}).div(7, "floor"))).size(0),
            2);
}

TEST(Loader, NoShuffleKeepsTheDatasetOrder) {
  Loader loader(numbered_images(30), LoaderOptions().batch_size(7).shuffle(false).drop_last(false));
  EXPECT_TRUE(torch::equal(targets_of(collect(loader, 4)), torch::arange(30)));
}

TEST(Loader, ChannelsLast) {
  auto dataset = std::make_shared<TensorDataset>(torch::rand({20, 3, 4, 5}), torch::arange(20));
  Loader loader(dataset, LoaderOptions().batch_size(4).channels_last(true));
  for (Batch& batch : loader.epoch(0)) {
    EXPECT_TRUE(batch.input.is_contiguous(at::MemoryFormat::ChannelsLast));
    EXPECT_FALSE(batch.input.is_contiguous());
  }
}

// One channel: both layouts hold the same bytes, and only the strides tell a convolution which to
// compute in (LibTorch's contiguous(ChannelsLast) kept NCHW strides, and Fashion-MNIST models ran
// NCHW under --channels-last). The values stay the dataset's.
TEST(Loader, ChannelsLastOneChannelImagesHaveItsStrides) {
  const torch::Tensor images = torch::rand({8, 1, 4, 5});
  auto dataset = std::make_shared<TensorDataset>(images, torch::arange(8));
  Loader loader(dataset, LoaderOptions().batch_size(8).shuffle(false).channels_last(true));
  for (Batch& batch : loader.epoch(0)) {
    EXPECT_EQ(batch.input.suggest_memory_format(), at::MemoryFormat::ChannelsLast);
    EXPECT_EQ(batch.input.strides(), (std::vector<int64_t>{20, 1, 5, 1}));
    EXPECT_TRUE(torch::equal(batch.input, images));
  }
}

pid_t thread_id() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Records the kernel id of every thread that builds a batch (kernel ids are not reused soon,
// unlike std::thread::id, so a recreated thread shows up as a new id).
class ThreadRecorder : public BatchTransform {
 public:
  Batch operator()(Batch batch, uint64_t) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    ids_.insert(thread_id());
    return batch;
  }
  std::set<pid_t> ids() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ids_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::set<pid_t> ids_;
};

TEST(Loader, WorkerThreadsPersistAcrossEpochs) {
  auto recorder = std::make_shared<ThreadRecorder>();
  Loader loader(numbered_images(400), LoaderOptions().batch_size(4).workers(2), recorder);
  for (int64_t epoch = 0; epoch < 4; ++epoch) collect(loader, epoch);
  auto ids = recorder->ids();
  EXPECT_GE(ids.size(), 1u);
  EXPECT_LE(ids.size(), 2u);
  EXPECT_EQ(ids.count(thread_id()), 0u);
}

TEST(Loader, ZeroWorkersLoadInTheCallingThread) {
  auto recorder = std::make_shared<ThreadRecorder>();
  Loader loader(numbered_images(40), LoaderOptions().batch_size(4).workers(0), recorder);
  collect(loader, 0);
  EXPECT_EQ(recorder->ids(), std::set<pid_t>{thread_id()});
}

// Counts the batches built.
class BuildCounter : public BatchTransform {
 public:
  Batch operator()(Batch batch, uint64_t) const override {
    ++built;
    return batch;
  }
  mutable std::atomic<int> built{0};
};

TEST(Loader, PrefetchBoundsTheBatchesInFlight) {
  auto counter = std::make_shared<BuildCounter>();
  Loader loader(numbered_images(1000), LoaderOptions().batch_size(2).workers(2).prefetch(3), counter);
  auto range = loader.epoch(0);
  auto it = range.begin();
  // However long the consumer dawdles, at most prefetch * workers batches run ahead of it.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(counter->built.load(), 1 + 3 * 2);
  ++it;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(counter->built.load(), 2 + 3 * 2);
}

TEST(Loader, RejectsBadOptions) {
  auto dataset = numbered_images(10);
  auto expect_usage = [&](const LoaderOptions& options, const std::string& part) {
    EXPECT_TRUE(Contains(error_message<UsageError>([&] { Loader(dataset, options); }), part));
  };
  expect_usage(LoaderOptions().batch_size(0), "batch_size: 0 is not positive");
  expect_usage(LoaderOptions().workers(-1), "workers: -1 is negative");
  expect_usage(LoaderOptions().prefetch(0), "prefetch: 0 is not positive");
  expect_usage(LoaderOptions().batch_size(11), "batch_size: 11 with 10 samples and drop_last gives no batch");
  EXPECT_TRUE(Contains(error_message<UsageError>([] { Loader(nullptr, LoaderOptions()); }), "dataset: is null"));

  Loader loader(dataset, LoaderOptions().batch_size(3));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { loader.epoch(0, 4); }), "start_batch: 4 is outside [0, 3]"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { loader.epoch(-1); }), "epoch: -1 is negative"));
  auto range = loader.epoch(0);
  range.begin();
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { range.begin(); }), "iterated only once"));
}

TEST(ChooseWorkers, PicksACandidate) {
  const int chosen = choose_workers(numbered_images(512), LoaderOptions().batch_size(32), augmentation(),
                                    std::chrono::milliseconds(300));
  EXPECT_GE(chosen, 0);
  EXPECT_LE(chosen, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_TRUE(Contains(error_message<UsageError>([] {
                         choose_workers(numbered_images(8), LoaderOptions(), nullptr, std::chrono::milliseconds(0));
                       }),
                       "budget: 0 ms is not positive"));
}

}  // namespace
}  // namespace afterburner::data
