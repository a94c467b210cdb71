// A 4-D tensor laid out channels_last so that LibTorch sees it so, one channel included.
//
//   images = afterburner::channels_last(images);   // [N, 1, 28, 28]: strides (784, 1, 28, 1)
//   conv->weight.set_data(afterburner::channels_last(conv->weight));
//
// LibTorch's contiguous(ChannelsLast) returns a tensor whose sizes make both layouts alike (one
// channel, or 1x1 pixels) as it is, with NCHW strides; suggest_memory_format() then reports NCHW,
// and a convolution taking such an input and weight (a Fashion-MNIST stem) computes NCHW, as does
// every layer after it: --channels-last had no effect on one-channel images. torch.nn.Module.to
// (memory_format=torch.channels_last) restrides such tensors; this does the same.
#pragma once

#include <torch/types.h>

namespace afterburner {

// `tensor` itself where suggest_memory_format() already says ChannelsLast, else a channels_last copy.
torch::Tensor channels_last(const torch::Tensor& tensor);

}  // namespace afterburner
