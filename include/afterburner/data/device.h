// Moving batches to the training device. On the CPU both are identities; with CUDA the host
// tensors are pinned so the copies run asynchronously, and the Prefetcher issues the next
// batch's copy before handing out the current one, overlapping transfer with the step.
//
//   torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
//   Prefetcher batches(loader.epoch(epoch), device);
//   for (Batch& batch : batches) train_step(batch);   // already on `device`
#pragma once

#include <c10/core/Device.h>

#include <optional>

#include "afterburner/data/loader.h"

namespace afterburner::data {

// The batch on `device`: unchanged if it is there already, else pinned host memory copied
// with non_blocking=true (copies to the CPU stay synchronous).
Batch to_device(Batch batch, torch::Device device);

// Iterates an epoch with the next batch already staged on the device.
class Prefetcher {
 public:
  class Iterator {
   public:
    Batch& operator*() const { return *prefetcher_->current_; }
    Batch* operator->() const { return &*prefetcher_->current_; }
    Iterator& operator++() {
      prefetcher_->advance();
      return *this;
    }
    bool operator==(const Iterator& other) const { return at_end() == other.at_end(); }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    friend class Prefetcher;
    explicit Iterator(Prefetcher* prefetcher) : prefetcher_(prefetcher) {}
    bool at_end() const { return !prefetcher_ || !prefetcher_->current_; }
    Prefetcher* prefetcher_;
  };

  Prefetcher(EpochRange epoch, torch::Device device);
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Stages the first two batches; call once.
  Iterator begin();
  Iterator end() { return Iterator(nullptr); }

 private:
  void advance();
  std::optional<Batch> stage_next();

  EpochRange epoch_;
  torch::Device device_;
  std::optional<EpochRange::Iterator> source_;
  std::optional<Batch> current_, staged_;
};

}  // namespace afterburner::data
