#include "afterburner/core/onednn_tensor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace afterburner {
namespace {

// Where element (n, c, h, w) of `images` sits in its buffer, read as the layout says: the test's
// own reading of oneDNN's layouts, checked against LibTorch's to_dense. Depth 1 is NCHW, else
// blocks of `depth` channels (NHWC being one block of all channels).
int64_t offset(const OnednnImages& images, int64_t channels, int64_t n, int64_t c, int64_t h, int64_t w) {
  const bool planes = images.depth == 1;
  const int64_t image = planes ? n * channels + c : n * (images.padded_channels / images.depth) + c / images.depth;
  const int64_t lane = planes ? 0 : c % images.depth;
  return ((image * images.height + h) * images.width + w) * images.depth + lane;
}

void expect_reads_as_to_dense(const torch::Tensor& onednn) {
  const auto images = onednn_images(onednn);
  ASSERT_TRUE(images);
  const auto dense = onednn.to_dense();
  EXPECT_EQ(images->height, dense.size(2));
  EXPECT_EQ(images->width, dense.size(3));
  EXPECT_EQ(images->padded_channels % images->depth, 0);
  const auto* data = static_cast<const float*>(images->data);
  for (int64_t n = 0; n < dense.size(0); ++n) {
    for (int64_t c = 0; c < dense.size(1); ++c) {
      for (int64_t h = 0; h < dense.size(2); ++h) {
        for (int64_t w = 0; w < dense.size(3); ++w) {
          ASSERT_EQ(data[offset(*images, dense.size(1), n, c, h, w)], dense[n][c][h][w].item<float>())
              << "at " << n << "," << c << "," << h << "," << w;
        }
      }
    }
  }
}

TEST(OnednnImages, PlainTensorsAreImagesOfDepthOne) {
  const auto x = torch::randn({2, 5, 3, 4});
  const auto images = onednn_images(x.to_mkldnn());
  ASSERT_TRUE(images);
  EXPECT_EQ(images->images, 10);
  EXPECT_EQ(images->depth, 1);
  EXPECT_EQ(images->padded_channels, 5);
  EXPECT_EQ(images->dtype, at::kFloat);
  expect_reads_as_to_dense(x.to_mkldnn());
}

// A convolution's output is channel-blocked (blocks of 16 with AVX-512, 8 with AVX2); 20
// channels pad the last block.
TEST(OnednnImages, ConvolutionOutputsAreChannelBlocked) {
  torch::manual_seed(0);
  const torch::NoGradGuard no_grad;
  for (const int64_t channels : {20, 32}) {
    const auto y = torch::mkldnn_convolution(torch::randn({3, 4, 6, 7}).to_mkldnn(),
                                             torch::randn({channels, 4, 3, 3}).to_mkldnn(), {}, {1, 1}, {1, 1},
                                             {1, 1}, 1);
    const auto images = onednn_images(y);
    ASSERT_TRUE(images);
    EXPECT_TRUE(images->depth == 8 || images->depth == 16) << images->depth;
    EXPECT_EQ(images->padded_channels % images->depth, 0);
    EXPECT_GE(images->padded_channels, channels);
    EXPECT_LT(images->padded_channels, channels + images->depth);
    EXPECT_EQ(images->images, 3 * images->padded_channels / images->depth);
    expect_reads_as_to_dense(y);
  }
}

TEST(OnednnImages, EmptyTensorsTakeTheLayoutWithZeroPadding) {
  const torch::NoGradGuard no_grad;
  const auto y = torch::mkldnn_convolution(torch::randn({1, 4, 6, 6}).to_mkldnn(),
                                           torch::randn({20, 4, 3, 3}).to_mkldnn(), {}, {1, 1}, {1, 1}, {1, 1}, 1);
  const auto like = onednn_images(y);
  const auto out = empty_onednn_images(y, {2, 20, 3, 5});
  const auto images = onednn_images(out);
  ASSERT_TRUE(images);
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{2, 20, 3, 5}));
  EXPECT_EQ(images->depth, like->depth);
  EXPECT_EQ(images->padded_channels, like->padded_channels);
  // Fill every real channel through the layout, then read back through LibTorch.
  auto* data = static_cast<float*>(images->data);
  const auto expected = torch::arange(2 * 20 * 3 * 5, torch::kFloat).view({2, 20, 3, 5});
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t c = 0; c < 20; ++c) {
      for (int64_t h = 0; h < 3; ++h) {
        for (int64_t w = 0; w < 5; ++w) {
          data[offset(*images, 20, n, c, h, w)] = expected[n][c][h][w].item<float>();
        }
      }
    }
  }
  EXPECT_TRUE(torch::equal(out.to_dense(), expected));
  // The padding channels are zero: a 1x1 convolution summing all channels sees only the real ones.
  const auto summed = torch::mkldnn_convolution(out, torch::ones({1, 20, 1, 1}).to_mkldnn(), {}, {0, 0}, {1, 1},
                                                {1, 1}, 1);
  EXPECT_TRUE(torch::equal(summed.to_dense(), expected.sum(1, true)));
}

TEST(OnednnImages, OtherTensorsAreNotImages) {
  EXPECT_FALSE(onednn_images(torch::randn({2, 3, 4, 5})));              // dense
  EXPECT_FALSE(onednn_images(torch::randn({3, 4, 5}).to_mkldnn()));     // 3-D
  EXPECT_FALSE(onednn_images(torch::Tensor()));
}

}  // namespace
}  // namespace afterburner
