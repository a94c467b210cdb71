#include "afterburner/kernels/depthwise_conv.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "afterburner/core/onednn_tensor.h"
#include "simd.h"

namespace afterburner::kernels {

namespace {

constexpr int64_t kChannelBlock = simd::kLanes;  // nChw16c's channel block: one vector per pixel

struct DepthwiseGeometry {
  int64_t height, width, out_height, out_width, padding;
};

__attribute__((always_inline)) inline simd::Vec epilogue_of(simd::Vec s, const DepthwiseEpilogue& epilogue) {
  switch (epilogue.activation) {
    case DepthwiseActivation::none:
      return s;
    case DepthwiseActivation::clip:  // comparisons with NaN are false: NaN stays
      s = s < epilogue.lower ? simd::Vec{} + epilogue.lower : s;
      return s > epilogue.upper ? simd::Vec{} + epilogue.upper : s;
    case DepthwiseActivation::hardswish: {
      simd::Vec t = s + 3.0f;
      t = t < 0.0f ? simd::Vec{} : t;
      t = t > 6.0f ? simd::Vec{} + 6.0f : t;
      return s * t / 6.0f;
    }
    case DepthwiseActivation::silu:
      return simd::silu(s);
  }
  return s;
}

// The sum of the K x K taps of the window whose top-left corner is `corner` in rows `row_length`
// values apart, taps unrolled.
template <int64_t K>
__attribute__((always_inline)) inline simd::Vec window_sum(simd::Vec sum, const float* corner, int64_t row_length,
                                                           const simd::Vec* w) {
#pragma GCC unroll 3
  for (int64_t i = 0; i < K; ++i) {
#pragma GCC unroll 3
    for (int64_t j = 0; j < K; ++j) sum += simd::load(corner + i * row_length + j * kChannelBlock) * w[i * K + j];
  }
  return sum;
}

// Channel-block images [begin, end) of x (`blocks` per sample), each [height][width][16], into y's.
// weights: [blocks][K * K][16], biases [blocks][16]. Windows on the border sum the taps that fall
// inside (no zeros multiplied in: an infinite weight adds nothing there, as in oneDNN's).
template <int64_t K, int64_t S>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void convolve_channel_blocks(
    const DepthwiseGeometry& g, const float* x, const float* weights, const float* biases, float* y, int64_t blocks,
    int64_t begin, int64_t end, const DepthwiseEpilogue& epilogue) {
  const int64_t row = g.width * kChannelBlock;
  for (int64_t image = begin; image < end; ++image) {
    const int64_t block = image % blocks;
    const float* in = x + image * g.height * row;
    float* out = y + image * g.out_height * g.out_width * kChannelBlock;
    simd::Vec w[K * K];
    for (int64_t tap = 0; tap < K * K; ++tap) w[tap] = simd::load(weights + (block * K * K + tap) * kChannelBlock);
    const simd::Vec bias = simd::load(biases + block * kChannelBlock);
    for (int64_t oh = 0; oh < g.out_height; ++oh) {
      const int64_t top = oh * S - g.padding;
      const bool rows_inside = top >= 0 && top + K <= g.height;
      const int64_t first_row = std::max<int64_t>(0, -top), end_row = std::min<int64_t>(K, g.height - top);
      for (int64_t ow = 0; ow < g.out_width; ++ow) {
        const int64_t left = ow * S - g.padding;
        simd::Vec sum = bias;
        if (rows_inside && left >= 0 && left + K <= g.width) {  // the window inside the image: taps unrolled
          const float* corner = in + top * row + left * kChannelBlock;
#pragma GCC unroll 3
          for (int64_t i = 0; i < K; ++i) {
#pragma GCC unroll 3
            for (int64_t j = 0; j < K; ++j) sum += simd::load(corner + i * row + j * kChannelBlock) * w[i * K + j];
          }
        } else {
          const int64_t first_column = std::max<int64_t>(0, -left), end_column = std::min<int64_t>(K, g.width - left);
          for (int64_t i = first_row; i < end_row; ++i) {
            for (int64_t j = first_column; j < end_column; ++j) {
              sum += simd::load(in + (top + i) * row + (left + j) * kChannelBlock) * w[i * K + j];
            }
          }
        }
        simd::store(out + (oh * g.out_width + ow) * kChannelBlock, epilogue_of(sum, epilogue));
      }
    }
  }
}

using DepthwiseKernel = void (*)(const DepthwiseGeometry&, const float*, const float*, const float*, float*,
                                 int64_t, int64_t, int64_t, const DepthwiseEpilogue&);

// [C] or [C, k * k] fp32 values as [blocks][k * k][16], the padding channels' zero.
at::Tensor in_channel_blocks(const at::Tensor& values, int64_t blocks) {
  const int64_t channels = values.size(0), taps = values.numel() / channels;
  at::Tensor padded = at::zeros({blocks * kChannelBlock, taps}, values.options());
  padded.narrow(0, 0, channels).copy_(values.reshape({channels, taps}));
  return padded.view({blocks, kChannelBlock, taps}).transpose(1, 2).contiguous();
}

}  // namespace

std::optional<torch::Tensor> depthwise_conv2d_onednn(const torch::Tensor& x, const torch::Tensor& weight,
                                                     const torch::Tensor& bias, int64_t stride, int64_t padding,
                                                     DepthwiseEpilogue epilogue) {
  const auto images = onednn_images(x);
  if (!images || images->dtype != at::kFloat || images->depth != kChannelBlock || x.size(1) <= 1) return std::nullopt;
  const int64_t channels = x.size(1), k = 3;
  const bool filters = !weight.is_mkldnn() && weight.scalar_type() == at::kFloat &&
                       weight.sizes() == at::IntArrayRef{channels, 1, k, k};
  const bool biases = !bias.defined() || (!bias.is_mkldnn() && bias.scalar_type() == at::kFloat &&
                                          bias.sizes() == at::IntArrayRef{channels});
  const DepthwiseKernel kernel = stride == 1   ? convolve_channel_blocks<3, 1>
                                 : stride == 2 ? convolve_channel_blocks<3, 2>
                                               : nullptr;
  if (!filters || !biases || !kernel || padding < 0 || padding >= k) return std::nullopt;
  const DepthwiseGeometry g{x.size(2), x.size(3), (x.size(2) + 2 * padding - k) / stride + 1,
                            (x.size(3) + 2 * padding - k) / stride + 1, padding};
  if (g.out_height < 1 || g.out_width < 1) return std::nullopt;
  const int64_t blocks = images->padded_channels / kChannelBlock;
  const at::Tensor packed_weights = in_channel_blocks(weight, blocks);
  const at::Tensor packed_biases = in_channel_blocks(bias.defined() ? bias : at::zeros({channels}, weight.options()), blocks);
  at::Tensor out = empty_onednn_images(x, {x.size(0), channels, g.out_height, g.out_width});
  const auto out_images = onednn_images(out);
  const auto* from = static_cast<const float*>(images->data);
  auto* to = static_cast<float*>(out_images->data);
  at::parallel_for(0, images->images, 1, [&](int64_t begin, int64_t end) {
    kernel(g, from, packed_weights.data_ptr<float>(), packed_biases.data_ptr<float>(), to, blocks, begin, end,
           epilogue);
  });
  zero_padding_channels(*out_images, channels);
  return out;
}

}  // namespace afterburner::kernels
