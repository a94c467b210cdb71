#include "afterburner/data/device.h"

namespace afterburner::data {
namespace {

torch::Tensor to_device(const torch::Tensor& tensor, torch::Device device) {
  if (tensor.device() == device) return tensor;
  // Only page-locked host memory can be copied asynchronously to an accelerator.
  const bool pin = tensor.is_cpu() && !device.is_cpu() && !tensor.is_pinned();
  return (pin ? tensor.pin_memory() : tensor).to(device, /*non_blocking=*/!device.is_cpu());
}

}  // namespace

Batch to_device(Batch batch, torch::Device device) {
  return {to_device(batch.input, device), to_device(batch.target, device)};
}

Prefetcher::Prefetcher(EpochRange epoch, torch::Device device) : epoch_(std::move(epoch)), device_(device) {}

Prefetcher::Iterator Prefetcher::begin() {
  current_ = stage_next();
  staged_ = stage_next();
  return Iterator(this);
}

void Prefetcher::advance() {
  current_ = std::move(staged_);
  staged_ = stage_next();
}

std::optional<Batch> Prefetcher::stage_next() {
  if (source_) {
    ++*source_;
  } else {
    source_ = epoch_.begin();
  }
  if (*source_ == epoch_.end()) return std::nullopt;
  return to_device(std::move(**source_), device_);
}

}  // namespace afterburner::data
