// kernels::depthwise_conv2d_onednn against LibTorch's convolution and activations in double, on
// oneDNN tensors as an optimized graph holds them (a convolution's channel-blocked output, whose
// pixels carry NaN and infinities through every channel): 6, 16 and 20 channels (6 and 20 pad
// their last block), batch 1 and 3, odd sizes and 1-pixel images, strides 1 and 2, paddings 0 to
// 2, each activation; a second call bit for bit, the input and weights left alone, the padding
// channels zero for the next convolution; infinite weights as LibTorch's fp32 convolution treats
// them; and the inputs it leaves to its caller.
#include "afterburner/kernels/depthwise_conv.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "afterburner/core/onednn_tensor.h"
#include "non_finite.h"

namespace afterburner::testing {
namespace {

using kernels::DepthwiseActivation;
using kernels::DepthwiseEpilogue;

// Images [N, 3, H, W] (NaN, +inf and -inf sprinkled) through a random 1x1 convolution on oneDNN:
// `channels` of them, in oneDNN's blocked layout.
torch::Tensor blocked_images(int64_t batch, int64_t channels, int64_t height, int64_t width) {
  const auto images = sprinkle_non_finite(torch::randn({batch, 3, height, width}) * 2);
  const auto weight = torch::randn({channels, 3, 1, 1});
  return torch::mkldnn_convolution(images.to_mkldnn(), weight.to_mkldnn(), {}, {0, 0}, {1, 1}, {1, 1}, 1);
}

// LibTorch's activation of y, in y's dtype.
torch::Tensor reference_activation(const torch::Tensor& y, const DepthwiseEpilogue& epilogue) {
  switch (epilogue.activation) {
    case DepthwiseActivation::none: return y;
    case DepthwiseActivation::clip: return torch::hardtanh(y, epilogue.lower, epilogue.upper);
    case DepthwiseActivation::hardswish: return torch::hardswish(y);
    case DepthwiseActivation::silu: return torch::silu(y);
  }
  return y;
}

// A 1x1 convolution summing all channels: oneDNN reads the padding channels too.
torch::Tensor summed_channels(const torch::Tensor& onednn) {
  const auto ones = torch::ones({1, onednn.size(1), 1, 1});
  return torch::mkldnn_convolution(onednn, ones.to_mkldnn(), {}, {0, 0}, {1, 1}, {1, 1}, 1).to_dense();
}

TEST(DepthwiseConv2dOnednn, AnswersAsLibTorchInDouble) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "oneDNN lays out nChw8c here, which the kernel leaves";
  torch::manual_seed(7);
  const torch::NoGradGuard no_grad;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<DepthwiseEpilogue> epilogues{{DepthwiseActivation::none},
                                                 {DepthwiseActivation::clip, 0, static_cast<float>(inf)},
                                                 {DepthwiseActivation::clip, 0, 6},
                                                 {DepthwiseActivation::clip, -1, 2},
                                                 {DepthwiseActivation::hardswish},
                                                 {DepthwiseActivation::silu}};
  const std::vector<std::vector<int64_t>> sizes{{1, 1}, {7, 9}, {12, 12}, {33, 35}};
  for (const int64_t channels : {6, 16, 20}) {
    for (const int64_t batch : {1, 3}) {
      for (const auto& size : sizes) {
        const auto x = blocked_images(batch, channels, size[0], size[1]);
        const auto dense_x = x.to_dense();
        const auto weight = torch::randn({channels, 1, 3, 3});
        const auto bias = torch::randn({channels});
        const auto weight_before = weight.clone();
        for (const int64_t stride : {1, 2}) {
          for (const int64_t padding : {0, 1, 2}) {
            if (size[0] + 2 * padding < 3 || size[1] + 2 * padding < 3) continue;
            const auto sums = torch::conv2d(dense_x.to(torch::kDouble), weight.to(torch::kDouble),
                                            bias.to(torch::kDouble), stride, padding, 1, channels);
            for (size_t e = 0; e < epilogues.size(); ++e) {
              SCOPED_TRACE(::testing::Message() << channels << " channels, batch " << batch << ", " << size[0] << "x"
                                                << size[1] << ", stride " << stride << ", padding " << padding
                                                << ", epilogue " << e);
              const auto out = kernels::depthwise_conv2d_onednn(x, weight, e % 2 ? bias : torch::Tensor(), stride,
                                                                padding, epilogues[e]);
              ASSERT_TRUE(out.has_value());
              ASSERT_TRUE(out->is_mkldnn());
              EXPECT_EQ(onednn_images(*out)->depth, 16) << "not in its input's layout";
              const auto expected_sums = e % 2 ? sums : sums - bias.to(torch::kDouble).view({1, -1, 1, 1});
              const auto expected = reference_activation(expected_sums, epilogues[e]);
              EXPECT_TRUE(AgreesWithNonFinite(out->to_dense(), expected, 1e-5, 1e-5));
              const auto again = kernels::depthwise_conv2d_onednn(x, weight, e % 2 ? bias : torch::Tensor(), stride,
                                                                  padding, epilogues[e]);
              EXPECT_TRUE(BitwiseEqual(again->to_dense(), out->to_dense())) << "second call";
              EXPECT_TRUE(AgreesWithNonFinite(summed_channels(*out), expected.sum(1, true), 1e-4, 1e-5))
                  << "as a convolution reads it: the padding channels 0";
            }
          }
        }
        EXPECT_TRUE(BitwiseEqual(x.to_dense(), dense_x)) << "input changed";
        EXPECT_TRUE(BitwiseEqual(weight, weight_before)) << "weights changed";
      }
    }
  }
}

// An infinite weight: LibTorch's fp32 convolution (oneDNN's) adds nothing for the taps that fall
// on the padding, where 0 times infinity would be NaN.
TEST(DepthwiseConv2dOnednn, InfiniteWeightsAddNothingOnThePadding) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "oneDNN lays out nChw8c here, which the kernel leaves";
  torch::manual_seed(8);
  const torch::NoGradGuard no_grad;
  const auto x = torch::mkldnn_convolution(torch::randn({2, 3, 6, 7}).to_mkldnn(),
                                           torch::randn({16, 3, 1, 1}).to_mkldnn(), {}, {0, 0}, {1, 1}, {1, 1}, 1);
  auto weight = torch::randn({16, 1, 3, 3});
  weight[3][0][0][0] = std::numeric_limits<float>::infinity();
  weight[5][0][2][1] = -std::numeric_limits<float>::infinity();
  for (const int64_t stride : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "stride " << stride);
    const auto expected =
        torch::mkldnn_convolution(x, weight.to_mkldnn(), {}, {1, 1}, {stride, stride}, {1, 1}, 16).to_dense();
    const auto out = kernels::depthwise_conv2d_onednn(x, weight, {}, stride, 1, {});
    ASSERT_TRUE(out.has_value());
    EXPECT_TRUE(AgreesWithNonFinite(out->to_dense(), expected, 1e-5, 1e-5));
  }
}

// nullopt where the caller computes it otherwise: 5x5 filters (oneDNN's are faster), stride 3 or 0,
// a plain-layout or bf16 oneDNN tensor, a dense tensor, weights that are not one filter per channel.
TEST(DepthwiseConv2dOnednn, LeavesOtherConvolutionsToItsCaller) {
  const torch::NoGradGuard no_grad;
  const auto x = blocked_images(2, 16, 8, 8);
  const auto weight = torch::randn({16, 1, 3, 3});
  const DepthwiseEpilogue none;
  EXPECT_TRUE(kernels::depthwise_conv2d_onednn(x, weight, {}, 1, 1, none).has_value() ||
              !__builtin_cpu_supports("avx512f"));
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x, torch::randn({16, 1, 5, 5}), {}, 1, 2, none));
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x, weight, {}, 3, 1, none));
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x, weight, {}, 0, 1, none)) << "stride 0";
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x, weight, {}, 1, 3, none)) << "padding past the filter";
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x.to_dense().to_mkldnn(), weight, {}, 1, 1, none)) << "plain layout";
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x.to_dense(), weight, {}, 1, 1, none)) << "dense";
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x, torch::randn({16, 2, 3, 3}), {}, 1, 1, none));
  EXPECT_FALSE(kernels::depthwise_conv2d_onednn(x, weight, torch::randn({15}), 1, 1, none)) << "bias size";
}

}  // namespace
}  // namespace afterburner::testing
