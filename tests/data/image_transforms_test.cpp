#include "afterburner/data/image_transforms.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

TEST(ImageTransforms, ListsParseToTorchvisionsParametersAndWriteOutInFull) {
  const ImageTransforms rrc = parse_image_transforms("rrc224:0.25,flip");
  EXPECT_EQ(rrc.crop, Crop::random_resized);
  EXPECT_EQ(rrc.size, 224);
  EXPECT_DOUBLE_EQ(rrc.min_area, 0.25);
  EXPECT_DOUBLE_EQ(rrc.flip, 0.5);
  EXPECT_TRUE(rrc.decodes());
  EXPECT_EQ(rrc.describe(0), "rrc224:0.25,flip:0.5");
  EXPECT_EQ(rrc.describe_evaluation(0), "resize256,centre224");

  const ImageTransforms resized = parse_image_transforms("resize146,crop128,flip:0.3");
  EXPECT_EQ(resized.crop, Crop::random);
  EXPECT_EQ(resized.resize, 146);
  EXPECT_EQ(resized.describe(0), "resize146,crop128,flip:0.3");
  EXPECT_EQ(resized.describe_evaluation(0), "resize146,centre128");
  EXPECT_EQ(parse_image_transforms("center32").crop, Crop::centre);

  const ImageTransforms cifar = parse_image_transforms("pad4,crop,flip");
  EXPECT_FALSE(cifar.decodes());  // held in memory: pad, crop back, flip
  EXPECT_EQ(cifar.size, 0);
  EXPECT_EQ(cifar.describe(32), "pad4,crop32,flip:0.5");
  EXPECT_EQ(parse_image_transforms(parse_image_transforms("resize146,crop128,flip:0.3").describe(0)).describe(0),
            "resize146,crop128,flip:0.3");  // the written-out list reads back as itself
  EXPECT_FALSE(parse_image_transforms("").crop);
}

TEST(ImageTransforms, DecodedImagesGetTheListInTrainingAndTheCentreOfTheSameResizeInEvaluation) {
  const ImageTransforms listed = parse_image_transforms("resize80,crop64,flip:0.25");
  const DecodeOptions training = listed.decode_options(true, 0);
  EXPECT_EQ(training.size(), 64);
  EXPECT_EQ(training.crop(), Crop::random);
  EXPECT_EQ(training.resize(), 80);
  EXPECT_DOUBLE_EQ(training.flip(), 0.25);
  const DecodeOptions evaluation = listed.decode_options(false, 64);
  EXPECT_EQ(evaluation.crop(), Crop::centre);
  EXPECT_EQ(evaluation.resize(), 80);
  EXPECT_DOUBLE_EQ(evaluation.flip(), 0);
  const DecodeOptions rrc = parse_image_transforms("rrc:0.5").decode_options(true, 112);  // the size given elsewhere
  EXPECT_EQ(rrc.size(), 112);
  EXPECT_DOUBLE_EQ(rrc.min_area(), 0.5);
  EXPECT_EQ(parse_image_transforms("rrc").decode_options(false, 112).resize(), 128);
  EXPECT_TRUE(Contains(error_message<UsageError>([] { parse_image_transforms("rrc64").side(32); }),
                       "the 64-pixel crop differs from the image size, 32"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { parse_image_transforms("pad4,crop").decode_options(true, 32); }),
                       "pad applies to images held in memory"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { parse_image_transforms("flip").decode_options(true, 32); }),
                       "need a crop"));
}

TEST(ImageTransforms, StoredImagesArePaddedCroppedAndFlippedAsTheFusedChainDoes) {
  const torch::Tensor images = torch::randint(0, 256, {6, 3, 8, 8}, torch::kByte);
  const Batch batch{images, torch::arange(6)};
  std::vector<TransformPtr> listed{to_float(1.0 / 255)}, direct{to_float(1.0 / 255), random_crop(3),
                                                                random_horizontal_flip(0.5)};
  for (TransformPtr& step : parse_image_transforms("pad3,crop8,flip").stored_transforms(8)) listed.push_back(step);
  EXPECT_TRUE(torch::equal((*compose(listed))(batch, 7).input, (*compose(direct))(batch, 7).input));
  EXPECT_TRUE(parse_image_transforms("").stored_transforms(8).empty());
  for (const char* decoded : {"rrc8", "resize10,crop8", "centre8", "crop8"}) {
    EXPECT_TRUE(Contains(error_message<UsageError>([&] { parse_image_transforms(decoded).stored_transforms(8); }),
                         "as they are decoded"))
        << decoded;
  }
  EXPECT_TRUE(Contains(error_message<UsageError>([] { parse_image_transforms("pad2,crop6").stored_transforms(8); }),
                       "the 6-pixel crop differs from the image size, 8"));
}

TEST(ImageTransforms, ABadListIsOneLineNamingTheOptionAndTheItem) {
  const std::vector<std::pair<const char*, const char*>> bad{
      {"rrc224,blur", "'blur' in 'rrc224,blur': unknown"},
      {"flip,flip", "given twice"},
      {"rrc224,crop224", "a second crop"},
      {"crop224,resize256", "comes after the crop"},
      {"resize256", "needs a crop after it"},
      {"pad4,centre32", "padding needs a crop"},
      {"resize200,crop224", "larger than the shorter side resized to 200"},
      {"resize256,rrc224", "takes no resize or pad"},
      {"rrc224:0", "not a number in (0, 1]"},
      {"flip:1.5", "not a number in [0, 1]"},
      {"flip0.3", "after a colon"},
      {"crop0", "at least 1"},
      {"crop12x", "is not a pixel count"},
      {"resize", "needs its pixels"},
      {"crop224:3", "takes no ':' parameter"},
      {"rrc224,,flip", "an empty item"}};
  for (const auto& [list, problem] : bad) {
    const std::string given = list;  // clang 14 lambdas cannot capture structured bindings
    const std::string message = error_message<UsageError>([&] { parse_image_transforms(given, "--transforms"); });
    EXPECT_TRUE(Contains(message, "--transforms")) << message;
    EXPECT_TRUE(Contains(message, problem)) << list << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace afterburner::data
