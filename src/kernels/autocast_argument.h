// Shared by the fused layers: their inputs go through what CPU autocast does to the arguments of
// the LibTorch op they replace, so they run in the same dtype that op would.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/types.h>

namespace afterburner::kernels {

// The autocast dtype's copy of `tensor` (cached for weights like autocast's own), or `tensor`
// itself outside autocast and for doubles. The cast is recorded by autograd, so gradients reach
// the original tensor in its own dtype.
inline torch::Tensor autocast_argument(const torch::Tensor& tensor) {
  if (!at::autocast::is_cpu_enabled()) return tensor;
  return at::autocast::cached_cast(at::autocast::get_autocast_cpu_dtype(), tensor, c10::DeviceType::CPU);
}

// The dtype autocast_argument(tensor) has, without casting.
inline at::ScalarType autocast_dtype(const torch::Tensor& tensor) {
  const bool cast = at::autocast::is_cpu_enabled() && at::autocast::is_eligible(tensor, c10::DeviceType::CPU);
  return cast ? at::autocast::get_autocast_cpu_dtype() : tensor.scalar_type();
}

}  // namespace afterburner::kernels
