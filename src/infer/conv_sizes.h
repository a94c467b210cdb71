// The output sizes of a 2-D convolution, for the inference kernels that call oneDNN themselves.
// Internal to src/infer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace afterburner::infer {

// [N, out_channels, height, width] of conv2d(x, weight) with these stride, padding and dilation
// (a height or width below 1 where the filter does not fit).
inline std::vector<int64_t> conv2d_output_sizes(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                                                at::IntArrayRef padding, at::IntArrayRef dilation) {
  std::vector<int64_t> sizes{x.size(0), weight.size(0)};
  for (int d = 0; d < 2; ++d) {
    const int64_t span = dilation[d] * (weight.size(2 + d) - 1) + 1;
    sizes.push_back((x.size(2 + d) + 2 * padding[d] - span) / stride[d] + 1);
  }
  return sizes;
}

}  // namespace afterburner::infer
