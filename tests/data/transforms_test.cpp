#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "afterburner/core/error.h"
#include "afterburner/data/transforms.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

torch::Tensor random_images(std::vector<int64_t> shape, uint64_t seed = 1) {
  torch::Generator generator = at::detail::createCPUGenerator(seed);
  return torch::randint(0, 256, shape, generator, torch::kByte);
}

Batch image_batch(std::vector<int64_t> shape) {
  return {random_images(shape), torch::arange(shape[0])};
}

torch::Tensor transformed(const TransformPtr& transform, const torch::Tensor& input, uint64_t seed = 7) {
  return (*transform)(Batch{input, torch::arange(input.size(0))}, seed).input;
}

TEST(ToFloat, ScalesInFloat) {
  auto input = random_images({2, 3, 4, 5});
  auto output = transformed(to_float(1.0 / 255), input);
  ASSERT_EQ(output.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(output.to(torch::kDouble), input.to(torch::kDouble) / 255.0, 0, 1e-7));
}

TEST(ToFloat, LeavesTheTargetsAlone) {
  Batch batch = (*to_float(2.0))(image_batch({3, 1, 2, 2}), 0);
  EXPECT_TRUE(torch::equal(batch.target, torch::arange(3)));
}

TEST(Normalize, MatchesAHandComputationInDouble) {
  const std::vector<double> mean{0.1, 0.5, -0.25}, std{0.2, 0.35, 1.5};
  auto input = torch::rand({4, 3, 5, 6});
  auto output = transformed(normalize(mean, std), input);
  ASSERT_EQ(output.scalar_type(), torch::kFloat);
  auto in = input.accessor<float, 4>();
  auto out = output.accessor<float, 4>();
  for (int64_t n = 0; n < 4; ++n) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t y = 0; y < 5; ++y) {
        for (int64_t x = 0; x < 6; ++x) {
          const double expected = (static_cast<double>(in[n][c][y][x]) - mean[c]) / std[c];
          ASSERT_NEAR(out[n][c][y][x], expected, 1e-6 * std::max(1.0, std::abs(expected)));
        }
      }
    }
  }
}

TEST(Normalize, OneMeanAppliesToEveryChannel) {
  auto input = torch::rand({2, 3, 4});
  auto output = transformed(normalize({0.5}, {0.25}), input);
  EXPECT_TRUE(torch::allclose(output, (input - 0.5) / 0.25, 1e-6, 1e-6));
}

TEST(Normalize, WorksOnFeatureVectors) {
  auto input = torch::rand({5, 2});
  auto output = transformed(normalize({1, 2}, {4, 8}), input);
  auto expected = (input - torch::tensor({1.0f, 2.0f})) / torch::tensor({4.0f, 8.0f});
  EXPECT_TRUE(torch::allclose(output, expected, 1e-6, 1e-6));
}

TEST(Normalize, RejectsBadArguments) {
  EXPECT_TRUE(Contains(error_message<UsageError>([] { normalize({0.1, 0.2}, {0.3}); }), "normalize: needs as many"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { normalize({0.1}, {0.0}); }), "std[0] = 0 is not positive"));
  auto three = normalize({0, 0, 0}, {1, 1, 1});
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { transformed(three, torch::rand({2, 2, 3, 3})); }),
                       "has 3 channel means but the input has 2 channels"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { transformed(three, random_images({2, 3, 3, 3})); }),
                       "expects float input"));
}

// The crop offsets each sample could have used: those where slicing the independently padded
// image reproduces the output.
std::vector<std::pair<int64_t, int64_t>> matching_offsets(const torch::Tensor& image, const torch::Tensor& cropped,
                                                          int64_t padding, double fill) {
  const int64_t height = image.size(1), width = image.size(2);
  auto padded = torch::constant_pad_nd(image, {padding, padding, padding, padding}, fill);
  std::vector<std::pair<int64_t, int64_t>> offsets;
  for (int64_t oy = 0; oy <= 2 * padding; ++oy) {
    for (int64_t ox = 0; ox <= 2 * padding; ++ox) {
      auto window = padded.slice(1, oy, oy + height).slice(2, ox, ox + width);
      if (torch::equal(window, cropped)) offsets.emplace_back(oy, ox);
    }
  }
  return offsets;
}

TEST(RandomCrop, EachSampleIsOneCropOfThePaddedImage) {
  const int64_t padding = 3;
  for (double fill : {0.0, 7.0}) {
    auto input = random_images({64, 2, 6, 9});
    auto output = transformed(random_crop(padding, fill), input);
    ASSERT_EQ(output.sizes(), input.sizes());
    std::set<std::pair<int64_t, int64_t>> seen;
    for (int64_t n = 0; n < input.size(0); ++n) {
      auto offsets = matching_offsets(input[n], output[n], padding, fill);
      ASSERT_EQ(offsets.size(), 1u) << "sample " << n;
      seen.insert(offsets[0]);
    }
    // 64 draws from 49 offsets: a fixed or barely random offset would show up here.
    EXPECT_GE(seen.size(), 20u);
  }
}

TEST(RandomCrop, PaddingLargerThanTheImage) {
  auto input = random_images({40, 1, 2, 3});
  auto output = transformed(random_crop(4), input);
  for (int64_t n = 0; n < input.size(0); ++n) {
    EXPECT_GE(matching_offsets(input[n], output[n], 4, 0.0).size(), 1u) << "sample " << n;
  }
}

TEST(RandomCrop, FloatInputAndSeeds) {
  auto input = torch::rand({8, 3, 5, 5});
  auto crop = random_crop(2, -1.5);
  auto first = transformed(crop, input, 11);
  EXPECT_TRUE(torch::equal(first, transformed(crop, input, 11)));
  EXPECT_FALSE(torch::equal(first, transformed(crop, input, 12)));
  for (int64_t n = 0; n < 8; ++n) EXPECT_EQ(matching_offsets(input[n], first[n], 2, -1.5).size(), 1u);
}

TEST(RandomCrop, RejectsNonImages) {
  auto message = error_message<UsageError>([] { transformed(random_crop(2), torch::rand({4, 28, 28})); });
  EXPECT_TRUE(Contains(message, "random_crop: expects [N, C, H, W] input"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { random_crop(-1); }), "padding -1 is negative"));
}

TEST(RandomHorizontalFlip, ProbabilityZeroAndOne) {
  auto input = random_images({16, 3, 4, 5});
  EXPECT_TRUE(torch::equal(transformed(random_horizontal_flip(0.0), input), input));
  EXPECT_TRUE(torch::equal(transformed(random_horizontal_flip(1.0), input), input.flip({3})));
}

TEST(RandomHorizontalFlip, HalfTheSamplesFlipOnAverage) {
  auto input = random_images({200, 1, 3, 4});
  auto output = transformed(random_horizontal_flip(0.5), input);
  auto mirrored = input.flip({3});
  int flipped = 0;
  for (int64_t n = 0; n < input.size(0); ++n) {
    const bool same = torch::equal(output[n], input[n]);
    ASSERT_TRUE(same || torch::equal(output[n], mirrored[n])) << "sample " << n;
    flipped += !same;
  }
  // Binomial(200, 0.5): 60..140 holds with probability 1 - 1e-8.
  EXPECT_GT(flipped, 60);
  EXPECT_LT(flipped, 140);
  EXPECT_TRUE(Contains(error_message<UsageError>([] { random_horizontal_flip(1.5); }), "p = 1.5 is not in [0, 1]"));
}

// The same stages with to_float hidden in a nested compose, which the fusion does not
// recognise: every stage then runs on its own, with the same stage seeds.
TransformPtr stage_by_stage(const std::vector<TransformPtr>& stages) {
  std::vector<TransformPtr> hidden = stages;
  hidden[0] = compose({stages[0]});
  return compose(hidden);
}

struct ChainCase {
  std::string name;
  std::vector<TransformPtr> stages;
  std::vector<int64_t> shape;
};

void PrintTo(const ChainCase& chain, std::ostream* out) { *out << chain.name; }

class FusedChain : public ::testing::TestWithParam<ChainCase> {};

TEST_P(FusedChain, EqualsTheStageByStageChain) {
  const ChainCase& chain = GetParam();
  TransformPtr fused = compose(chain.stages);
  TransformPtr unfused = stage_by_stage(chain.stages);
  ASSERT_EQ(fused->describe().rfind("fused_compose(", 0), 0u) << fused->describe();
  ASSERT_EQ(unfused->describe().rfind("compose(", 0), 0u) << unfused->describe();
  auto input = random_images(chain.shape);
  for (uint64_t seed : {0u, 1u, 99u}) {
    Batch a = (*fused)(Batch{input, torch::arange(chain.shape[0])}, seed);
    Batch b = (*unfused)(Batch{input, torch::arange(chain.shape[0])}, seed);
    ASSERT_EQ(a.input.scalar_type(), torch::kFloat);
    ASSERT_TRUE(a.input.is_contiguous());
    EXPECT_TRUE(torch::equal(a.input, b.input)) << "seed " << seed << ", max difference "
                                                << (a.input - b.input).abs().max().item<float>();
    EXPECT_TRUE(torch::equal(a.target, b.target));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Chains, FusedChain,
    ::testing::Values(
        ChainCase{"MnistAugmentation",
                  {to_float(1.0 / 255), normalize({0.2860}, {0.3530}), random_crop(2), random_horizontal_flip(0.5)},
                  {64, 1, 28, 28}},
        ChainCase{"CropBeforeNormalizePadsWithNormalizedZero",
                  {to_float(1.0 / 255), random_crop(3), normalize({0.2860}, {0.3530})},
                  {32, 1, 10, 12}},
        ChainCase{"FlipBeforeCrop",
                  {to_float(1.0 / 255), random_horizontal_flip(0.5), random_crop(2, 0.5), normalize({0.4}, {0.2})},
                  {64, 1, 7, 9}},
        ChainCase{"PerChannelStatistics",
                  {to_float(1.0 / 255), normalize({0.49, 0.48, 0.45}, {0.25, 0.24, 0.26}), random_crop(4),
                   random_horizontal_flip(0.5)},
                  {16, 3, 8, 6}},
        ChainCase{"PaddingBeyondTheImage", {to_float(0.5), random_crop(6), random_horizontal_flip(1.0)}, {16, 2, 3, 4}},
        ChainCase{"ConversionOnly", {to_float(1.0 / 255)}, {4, 1, 5, 5}},
        ChainCase{"NoCrop", {to_float(1.0 / 255), normalize({0.5}, {0.5}), random_horizontal_flip(0.5)},
                  {32, 1, 4, 4}}),
    [](const auto& info) { return info.param.name; });

// Padding happens in the space of the stage before the crop: 0 after normalize, the
// normalized value of 0 before it.
TEST(Compose, PaddingValueFollowsTheStageOrder) {
  // Mostly padding: a 2x2 image in an 18x18 frame is in view in ~3% of the crops.
  auto ones = torch::ones({400, 1, 2, 2}, torch::kByte);
  const float image = 1.5f, normalized_zero = -0.5f;
  auto crop_last = transformed(compose({to_float(1.0), normalize({0.25}, {0.5}), random_crop(8)}), ones);
  auto crop_first = transformed(compose({to_float(1.0), random_crop(8), normalize({0.25}, {0.5})}), ones);
  EXPECT_TRUE(torch::equal(std::get<0>(torch::_unique(crop_last)), torch::tensor({0.0f, image})));
  EXPECT_TRUE(torch::equal(std::get<0>(torch::_unique(crop_first)), torch::tensor({normalized_zero, image})));
}

TEST(Compose, DoesNotFuseOtherChains) {
  EXPECT_EQ(compose({normalize({0}, {1}), to_float(1)})->describe().rfind("compose(", 0), 0u);
  EXPECT_EQ(compose({to_float(1), random_crop(1), random_crop(1)})->describe().rfind("compose(", 0), 0u);
}

TEST(Compose, FusedChainFallsBackOnFloatInput) {
  TransformPtr chain = compose({to_float(2.0), normalize({0.5}, {0.25}), random_horizontal_flip(1.0)});
  auto input = torch::rand({3, 1, 2, 4});
  auto expected = ((input * 2.0f - 0.5f) * 4.0f).flip({3});
  EXPECT_TRUE(torch::allclose(transformed(chain, input), expected, 1e-6, 1e-6));
}

TEST(Compose, RejectsNull) {
  EXPECT_TRUE(Contains(error_message<UsageError>([] { compose({to_float(1), nullptr}); }),
                       "compose: transform 1 is null"));
}

}  // namespace
}  // namespace afterburner::data
