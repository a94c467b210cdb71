// Batches from a Dataset, gathered and transformed by persistent worker threads, delivered in
// order. The order is a function of (seed, epoch) alone and every batch's transform seed of
// (seed, epoch, batch), so the batches are the same for any worker count.
//
//   Loader loader(load_mnist(dir, Split::train), LoaderOptions().batch_size(128).workers(2),
//                 compose({to_float(1.0 / 255), normalize({0.2860}, {0.3530}), random_crop(2)}));
//   for (int64_t epoch = 0; epoch < 10; ++epoch) {
//     for (Batch& batch : loader.epoch(epoch)) train_step(batch.input, batch.target);
//   }
//   for (Batch& batch : loader.epoch(3, /*start_batch=*/100)) ...   // resume mid-epoch
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "afterburner/data/dataset.h"
#include "afterburner/data/transforms.h"

namespace afterburner::data {

// Data-parallel sharding as torch.utils.data.DistributedSampler(num_replicas=count, rank, shuffle,
// seed, drop_last=drop_uneven) does it: each epoch's order is torch.randperm(size) from a CPU
// generator seeded with seed + epoch (0 .. size-1 without shuffle), padded by repeating its start
// up to a multiple of `count` (or, dropping the uneven tail, cut down to one), and rank r takes
// positions r, r + count, r + 2 count, ...: the ranks' shards are disjoint and cover the epoch.
struct Shard {
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(int64_t, count) = 1;
  TORCH_ARG(bool, drop_uneven) = false;
};

// The sample indices of `shard` in `epoch` (UsageError for a rank outside the count).
torch::Tensor sharded_order(int64_t size, const Shard& shard, bool shuffle, uint64_t seed, int64_t epoch);

// The shard's part of an epoch's `order` (int64 [N]), padded or cut as above.
torch::Tensor shard_of(torch::Tensor order, const Shard& shard);

// FFCV's quasi-random order for data larger than memory: the blocks (`blocks`: each sample's,
// int64 [N]) in a random order, `window` of them at a time, the samples of a window shuffled
// together. Every sample once; a function of `seed` alone.
torch::Tensor block_local_order(const torch::Tensor& blocks, int64_t window, uint64_t seed);

struct LoaderOptions {
  TORCH_ARG(int64_t, batch_size) = 128;
  // Worker threads; 0 loads each batch in the thread that iterates.
  TORCH_ARG(int, workers) = 2;
  // Batches in flight (being built or ready) per worker; 0 workers build one at a time.
  TORCH_ARG(int64_t, prefetch) = 4;
  TORCH_ARG(bool, shuffle) = true;
  // Leaves out the last, partial batch.
  TORCH_ARG(bool, drop_last) = true;
  TORCH_ARG(uint64_t, seed) = 0;
  // Makes a 4-D input channels_last contiguous (one a transform wrote so stays so either way).
  TORCH_ARG(bool, channels_last) = false;
  // This rank's shard of every epoch, in DistributedSampler's order; none: all samples, in the
  // loader's own seeded order.
  TORCH_ARG(std::optional<Shard>, shard) = std::nullopt;
  // Shuffles a dataset with storage blocks (Dataset::storage_blocks) by block_local_order over
  // windows of `block_window` blocks, instead of a full shuffle; with a shard, each rank takes
  // its shard_of that order (the same on every rank).
  TORCH_ARG(bool, block_local) = false;
  TORCH_ARG(int64_t, block_window) = 16;
};

class LoaderCore;
struct EpochPlan;

// One pass over an epoch, a single-pass input range. Starting another epoch on the same
// loader supersedes this one; destroying it early stops its prefetching.
class EpochRange {
 public:
  class Iterator {
   public:
    Batch& operator*() const { return range_->current_; }
    Batch* operator->() const { return &range_->current_; }
    Iterator& operator++() {
      range_->advance();
      return *this;
    }
    bool operator==(const Iterator& other) const { return at_end() == other.at_end(); }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    friend class EpochRange;
    explicit Iterator(EpochRange* range) : range_(range) {}
    bool at_end() const { return !range_ || range_->finished_; }
    EpochRange* range_;
  };

  EpochRange(EpochRange&& other) noexcept;
  EpochRange& operator=(EpochRange&&) = delete;
  EpochRange(const EpochRange&) = delete;
  ~EpochRange();

  // Loads the first batch; call once.
  Iterator begin();
  Iterator end() { return Iterator(nullptr); }
  // The index within the epoch of the batch the iterator points at.
  int64_t batch_index() const { return next_batch_ - 1; }

 private:
  friend class Loader;
  EpochRange(std::shared_ptr<LoaderCore> core, std::shared_ptr<const EpochPlan> plan);
  void advance();

  std::shared_ptr<LoaderCore> core_;
  std::shared_ptr<const EpochPlan> plan_;
  int64_t next_batch_;
  bool started_ = false;
  bool finished_ = false;
  Batch current_;
};

class Loader {
 public:
  Loader(DatasetPtr dataset, LoaderOptions options, TransformPtr transform = nullptr);
  // Joins the workers, also in the middle of an epoch.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  // Batches start_batch .. batches_per_epoch() - 1 of `epoch`.
  EpochRange epoch(int64_t epoch, int64_t start_batch = 0);
  const LoaderOptions& options() const { return options_; }

 private:
  LoaderOptions options_;
  std::shared_ptr<LoaderCore> core_;
};

// The worker count (0 .. hardware threads) that loads fastest, each candidate timed for an
// equal share of `budget`. Batches are the same for every count, so this only tunes speed.
int choose_workers(DatasetPtr dataset, LoaderOptions options, TransformPtr transform,
                   std::chrono::milliseconds budget = std::chrono::milliseconds(3000));

}  // namespace afterburner::data
