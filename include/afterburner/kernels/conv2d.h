// 2-D convolution as torch::conv2d computes it, with two kinds of layer LibTorch 1.13 trains
// slowly taken elsewhere:
// - Depthwise convolutions (one filter per channel: groups == in_channels == out_channels;
//   MobileNets' and EfficientNets' 3x3 and 5x5, ConvNeXt's 7x7) train on a weight gradient of
//   ours. With LibTorch's oneDNN gradient, the backward of EfficientNet-B0's and
//   MobileNetV3-Small's 5x5 layers took 2.6-47x (fp32) and 9-44x (bf16) as long as with ours
//   (1,152 channels of 1 pixel: 37 ms against 0.9 ms in bf16; BENCHMARKS.md, "Depthwise
//   convolutions in training"), about half of a MobileNetV3-Small training step. Their forward
//   and input gradient stay LibTorch's (oneDNN), which are as fast as ours were.
// - Convolutions of 1-pixel images to 1-pixel outputs (a ResNet's last stage on 28-pixel inputs:
//   512 channels, 3x3 filters, padding 1), where one filter tap reads the pixel and the others
//   the padding: a linear layer on that tap (at::linear, with its own gradients), where oneDNN
//   convolves all nine. The weight's gradient comes back in the weight's own layout.
// - bf16 convolutions with at most 4 output pixels per image (a ResNet's third stage on 28-pixel
//   inputs) train on a weight gradient of ours: one GEMM of the output gradient by the values
//   each tap reads, where oneDNN's direct backward-weights kernel took 4x its forward's time
//   (6.5 ms against 1.5 ms for 256 channels on 2x2 images, batch 128). Output gradients with an
//   infinity or a NaN take LibTorch's, which adds nothing from the padding where the GEMM would
//   multiply its zeros in.
//
//   namespace kernels = afterburner::kernels;
//   torch::Tensor y = kernels::conv2d(x, weight, bias, /*stride=*/{2, 2}, /*padding=*/{1, 1},
//                                     /*dilation=*/{1, 1}, /*groups=*/x.size(1));
//   // == torch::conv2d(x, weight, bias, 2, 1, 1, x.size(1)), with the same gradients
//
// Under CPU autocast the convolution runs in the autocast dtype, as torch::conv2d's would.
// Other convolutions, and depthwise ones that are not fp32/bf16 or of other filter sizes, run
// LibTorch's own forward and backward. NaN and infinities propagate as in LibTorch's fp32
// backward: a filter tap that falls on the zero padding adds nothing to its gradient (LibTorch's
// bf16 backward, its fp64 one and its fp32 one on 1-pixel images multiply the padding's zeros in,
// so an infinite output gradient there makes that tap's gradient NaN; ours stays 0 or finite).
#pragma once

#include <torch/types.h>

#include <array>
#include <tuple>

namespace afterburner::kernels {

// conv2d(x, weight, bias, stride, padding, dilation, groups) for a batched [N, C, H, W] or
// unbatched [C, H, W] x, with explicit zero padding; bias may be undefined.
torch::Tensor conv2d(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     at::IntArrayRef stride = {1, 1}, at::IntArrayRef padding = {0, 0},
                     at::IntArrayRef dilation = {1, 1}, int64_t groups = 1);

// at::convolution_backward of a 2-D, non-transposed convolution: the gradients of x, weight and
// bias (undefined where `needed` says no or there is no bias) for the upstream gradient grad_y.
// Depthwise convolutions of fp32/bf16 tensors and bf16 ones of small images take our weight
// gradient, unless grad mode is on (a backward under create_graph), which needs LibTorch's
// differentiable one.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> conv2d_backward(
    const torch::Tensor& grad_y, const torch::Tensor& x, const torch::Tensor& weight, bool has_bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
    std::array<bool, 3> needed);

}  // namespace afterburner::kernels
