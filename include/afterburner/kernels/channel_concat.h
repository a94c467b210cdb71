// Concatenation along channels into a buffer with room to grow. A DenseNet block's every layer
// reads torch.cat(features, 1) of all the features so far, so a block of L layers copies its
// early features L times. Here the first concatenation goes into a buffer with `spare` channels
// more, and each later one writes only the new features after the ones already there:
//
//   auto block = afterburner::kernels::concat_reserve({x0}, /*spare=*/64);   // torch.cat([x0], 1)
//   auto y1 = layer1(block);                                                 // 32 channels
//   block = afterburner::kernels::concat_append(block, {y1}, /*spare=*/32);  // cat([x0, y1], 1)
//   block = afterburner::kernels::concat_append(block, {layer2(block)}, 0);
//
// Values and sizes are torch.cat's (copies of the inputs' bits); a result is a dense channel slice
// of its buffer: contiguous at batch 1, batch-strided otherwise. fp32 oneDNN tensors (an optimized
// graph's convolution outputs) are read as their dense values, reordered straight into the buffer.
// Both are registered with the dispatcher (afterburner::concat_reserve, afterburner::concat_append);
// infer's concatenate_into_growing_buffers rewrites inference graphs onto them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace afterburner::kernels {

// torch.cat(tensors, 1), in a buffer of `spare` more channels. Tensors that torch.cat would
// promote or refuse (other dtypes or sizes, not dense, fewer than 2 dims) and channels-last ones
// (whose layout torch.cat keeps) get at::cat's answer and no room.
at::Tensor concat_reserve(at::TensorList tensors, int64_t spare);

// torch.cat([held, *more], 1). When `held` is the widest result so far of a buffer made here and
// has room for `more`, only `more` is copied, into the channels after held's; otherwise
// concat_reserve([held, *more], spare). Earlier results of the buffer keep their values: each
// sees only its own channels, and a buffer is only ever written beyond its widest result.
at::Tensor concat_append(const at::Tensor& held, at::TensorList more, int64_t spare);

}  // namespace afterburner::kernels
