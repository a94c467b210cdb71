// Depthwise 3x3 convolutions for inference on oneDNN tensors in the channel-blocked layout
// oneDNN's convolutions write (nChw16c): MobileNets' and EfficientNets', with the activation after
// them applied as each output is written. oneDNN 2.6's own depthwise kernel moved EfficientNet-B0's
// activations at 13-26 GB/s where the memory moves 40. A 16-lane loop over each channel block's
// image, its taps unrolled, took 4.2-4.5 ms where oneDNN took 7.3-8.5 (144 channels of 56x56,
// batch 32, with SiLU) and 3.5 against 7.1-7.2 (32 channels of 112x112); at stride 2 and on images
// of 28x28 or less it was as fast as oneDNN, and slower on 5x5 and 7x7 filters (2.7 ms against
// 1.8-2.1 for 672 channels of 14x14), which it leaves.
//
//   namespace kernels = afterburner::kernels;
//   auto y = kernels::depthwise_conv2d_onednn(x, weight, bias, /*stride=*/2, /*padding=*/1,
//                                             {kernels::DepthwiseActivation::silu});
//   // y == silu(conv2d(x, weight, bias, 2, 1, 1, x.size(1))), a oneDNN tensor in x's layout
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>

namespace afterburner::kernels {

enum class DepthwiseActivation { none, clip, hardswish, silu };

// What is applied to each sum as it is written, as ATen computes it: clip(lower, upper) as
// hardtanh (ReLU, ReLU6), hardswish x * min(max(x + 3, 0), 6) / 6, silu x / (1 + exp(-x)) (to
// float rounding), NaN kept by each.
struct DepthwiseEpilogue {
  DepthwiseActivation activation = DepthwiseActivation::none;
  float lower = 0, upper = 0;  // clip's bounds, lower <= 0 <= upper
};

// y[n, c] = activation(bias[c] + sum over taps (i, j) of weight[c, 0, i, j] x[n, c, s h + i - p, s w + j - p])
// (positions outside x add nothing), for x an fp32 oneDNN tensor in nChw16c, weight a dense fp32
// [C, 1, 3, 3], bias a dense fp32 [C] or undefined, stride s 1 or 2, padding p < 3. The result is a oneDNN tensor in x's layout, its padding channels zero. nullopt for any
// other input, which the caller computes otherwise. Under the kernel contract: x and the weights
// are read only, NaN and infinities propagate as the sums and activations make them.
std::optional<torch::Tensor> depthwise_conv2d_onednn(const torch::Tensor& x, const torch::Tensor& weight,
                                                     const torch::Tensor& bias, int64_t stride, int64_t padding,
                                                     DepthwiseEpilogue epilogue);

}  // namespace afterburner::kernels
