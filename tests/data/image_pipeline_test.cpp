#include <gtest/gtest.h>
#include <torch/torch.h>
#include <turbojpeg.h>

#include "afterburner/core/error.h"
#include "afterburner/data/image_pipeline.h"
#include "afterburner/data/loader.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

using testing::TempDir;

// Smooth RGB (or gray) pixels, HWC: photographs' gradients rather than noise.
std::vector<uint8_t> gradient(int width, int height, int channels, int seed) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels));
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        pixels[(y * width + x) * channels + c] =
            static_cast<uint8_t>(128 + 100 * std::sin(x / (7.0 + c + seed) + y / (11.0 + 2 * c)));
      }
    }
  }
  return pixels;
}

void write_jpeg(const std::filesystem::path& path, int width, int height, int channels, int seed) {
  const std::vector<uint8_t> pixels = gradient(width, height, channels, seed);
  tjhandle handle = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(handle, pixels.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buffer, &size,
                        channels == 1 ? TJSAMP_GRAY : TJSAMP_420, 92, 0),
            0);
  testing::write_file(path, std::string(reinterpret_cast<const char*>(buffer), size));
  tjFree(buffer);
  tjDestroy(handle);
}

// A folder of two classes of JPEGs of various sizes, one of them grayscale.
struct PhotoFolder {
  PhotoFolder() {
    const std::vector<std::tuple<const char*, int, int, int>> images{
        {"cat/a.jpg", 320, 240, 3}, {"cat/b.jpg", 200, 310, 3}, {"cat/c.jpg", 97, 64, 1},
        {"dog/d.jpg", 400, 400, 3}, {"dog/e.jpg", 256, 300, 3}, {"dog/f.jpg", 333, 128, 3}};
    int seed = 0;
    for (const auto& [name, width, height, channels] : images) {
      std::filesystem::create_directories((dir / name).parent_path());
      write_jpeg(dir / name, width, height, channels, seed++);
    }
    files = std::make_shared<const ImageFiles>(list_image_folder(dir.path().string()));
  }
  TempDir dir;
  std::shared_ptr<const ImageFiles> files;
};

std::vector<Batch> epoch_of(const PhotoFolder& folder, const DecodeOptions& options, int workers, int64_t epoch = 0) {
  Loader loader(folder.files, LoaderOptions().batch_size(4).drop_last(false).workers(workers).seed(5),
                decode_images(folder.files, options));
  std::vector<Batch> batches;
  for (Batch& batch : loader.epoch(epoch)) batches.push_back(std::move(batch));
  return batches;
}

TEST(ImagePipeline, ResamplingAtTheSameSizeIsTheIdentityAndAConstantStaysConstant) {
  Pixels pixels;
  pixels.width = 9;
  pixels.height = 7;
  pixels.channels = 3;
  pixels.hwc = gradient(9, 7, 3, 1);
  const torch::Tensor image =
      torch::from_blob(pixels.hwc.data(), {7, 9, 3}, torch::kByte).permute({2, 0, 1}).to(torch::kFloat);
  EXPECT_TRUE(torch::equal(resample_box(pixels, Box{1, 0, 7, 7}, 7), image.narrow(2, 1, 7)));
  std::fill(pixels.hwc.begin(), pixels.hwc.end(), 77);
  for (int64_t size : {1, 3, 5, 16}) {  // down and up
    EXPECT_LT((resample_box(pixels, Box{0, 0, 9, 7}, size) - 77).abs().max().item<float>(), 1e-4f) << size;
  }
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { resample_box(pixels, Box{3, 0, 7, 7}, 4); }), "not inside"));
}

TEST(ImagePipeline, BatchesAreTheSameForAnyWorkerCountAndOnASecondRun) {
  PhotoFolder folder;
  const DecodeOptions options = DecodeOptions().size(32).mean({0.5, 0.4, 0.3}).std({0.2, 0.25, 0.3});
  const std::vector<Batch> serial = epoch_of(folder, options, 0);
  ASSERT_EQ(serial.size(), 2u);
  EXPECT_EQ(serial[0].input.sizes(), (std::vector<int64_t>{4, 3, 32, 32}));
  EXPECT_EQ(serial[1].input.size(0), 2);
  for (int workers : {1, 2}) {
    const std::vector<Batch> threaded = epoch_of(folder, options, workers);
    for (size_t b = 0; b < serial.size(); ++b) {
      EXPECT_TRUE(torch::equal(threaded[b].input, serial[b].input)) << workers;
      EXPECT_TRUE(torch::equal(threaded[b].target, serial[b].target)) << workers;
    }
  }
  EXPECT_FALSE(torch::equal(epoch_of(folder, options, 0, /*epoch=*/1)[0].input, serial[0].input));
  EXPECT_TRUE(torch::isfinite(serial[0].input).all().item<bool>());
}

// The pixels of `path`, decoded whole: uint8 [C, H, W].
torch::Tensor stored_pixels(const std::string& path) {
  const std::string bytes = testing::read_file(path);
  Pixels pixels = decode_pixels(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
  return torch::from_blob(pixels.hwc.data(), {pixels.height, pixels.width, pixels.channels}, torch::kByte)
      .permute({2, 0, 1})
      .clone();
}

// Where `window` [C, S, S] lies in `image` [C, H, W] (channels repeated from a gray one), as
// (x, y); (-1, -1) when nowhere.
std::pair<int64_t, int64_t> find_window(const torch::Tensor& image, const torch::Tensor& window) {
  const int64_t side = window.size(1);
  const torch::Tensor wanted = window.narrow(0, 0, image.size(0));
  for (int64_t y = 0; y + side <= image.size(1); ++y) {
    for (int64_t x = 0; x + side <= image.size(2); ++x) {
      if (torch::equal(image.narrow(1, y, side).narrow(2, x, side), wanted)) return {x, y};
    }
  }
  return {-1, -1};
}

// One epoch's images of `folder` in file order, as uint8 pixel values (unnormalised options).
torch::Tensor pixel_values(const PhotoFolder& folder, const DecodeOptions& options, int64_t epoch) {
  Loader loader(folder.files, LoaderOptions().batch_size(6).shuffle(false).drop_last(false).workers(0).seed(2),
                decode_images(folder.files, options));
  return (loader.epoch(epoch).begin()->input * 255).round().to(torch::kByte);
}

// CenterCrop's offset of `side` in `total` (rounded half to even, as Python's round()).
int64_t centred(int64_t total, int64_t side) { return static_cast<int64_t>(std::nearbyint((total - side) / 2.0)); }

TEST(ImagePipeline, CentreCropsAreNormalisedAndGrayRepeatedAndMirroredWhenAsked) {
  PhotoFolder folder;
  const DecodeOptions options = DecodeOptions().size(24).crop(Crop::centre).flip(0).mean({0.5}).std({0.25});
  Loader loader(folder.files, LoaderOptions().batch_size(6).shuffle(false).drop_last(false).workers(0),
                decode_images(folder.files, options));
  const Batch batch = *loader.epoch(0).begin();
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({0, 0, 0, 1, 1, 1}, torch::kLong)));
  for (int64_t i = 0; i < 6; ++i) {
    const torch::Tensor image = stored_pixels(folder.files->files().paths[i]);
    const torch::Tensor window = image.narrow(1, centred(image.size(1), 24), 24).narrow(2, centred(image.size(2), 24), 24);
    const torch::Tensor reference = (window.to(torch::kFloat) / 255 - 0.5) / 0.25;  // c.jpg's gray, repeated
    EXPECT_LT((batch.input[i] - reference.expand({3, -1, -1})).abs().max().item<float>(), 1e-5f) << i;
  }
  const Batch mirrored =
      *Loader(folder.files, LoaderOptions().batch_size(6).shuffle(false).workers(0),
              decode_images(folder.files, DecodeOptions(options).flip(1)))
           .epoch(0)
           .begin();
  EXPECT_TRUE(torch::equal(mirrored.input, batch.input.flip(3)));
}

TEST(ImagePipeline, RandomAndCentreCropsOfUnresizedImagesAreTheirPixelWindows) {
  PhotoFolder folder;
  const DecodeOptions random = DecodeOptions().size(40).crop(Crop::random).flip(0).reduced_decode(false);
  const torch::Tensor first = pixel_values(folder, random, 0), second = pixel_values(folder, random, 1);
  const torch::Tensor centre = pixel_values(folder, DecodeOptions(random).crop(Crop::centre), 0);
  const torch::Tensor mirrored = pixel_values(folder, DecodeOptions(random).flip(1), 0);
  int64_t moved = 0;
  for (int64_t i = 0; i < 6; ++i) {
    const std::string path = folder.files->files().paths[i];
    const torch::Tensor image = stored_pixels(path);
    const auto [x, y] = find_window(image, first[i]);
    EXPECT_GE(x, 0) << path;  // RandomCrop(40): a window of the stored pixels, anywhere in it
    EXPECT_GE(find_window(image, second[i]).first, 0) << path;
    moved += x != find_window(image, second[i]).first || y != find_window(image, second[i]).second;
    EXPECT_EQ(find_window(image, centre[i]), std::make_pair(centred(image.size(2), 40), centred(image.size(1), 40)))
        << path;
    EXPECT_TRUE(torch::equal(mirrored[i], first[i].flip(2))) << path;  // the same window, mirrored
  }
  EXPECT_GE(moved, 4);  // another epoch, other windows
}

TEST(ImagePipeline, AnImageSmallerThanAnUnresizedCropIsOneLineNamingItOrSkipped) {
  PhotoFolder folder;  // c.jpg is 97x64
  const std::string small = folder.files->files().paths[2];
  const std::string message = error_message<DataError>(
      [&] { epoch_of(folder, DecodeOptions().size(100).crop(Crop::centre).flip(0), 0); });
  EXPECT_TRUE(Contains(message, small + ": 97x64 is smaller than the 100-pixel crop")) << message;
  EXPECT_NO_THROW(epoch_of(folder, DecodeOptions().size(100).crop(Crop::centre).resize(110), 0));  // resized first
  SkippedInputs skipped;
  const ImageFileList kept = readable_images(folder.files->files(), skipped, 100);
  EXPECT_EQ(kept.paths.size(), 5u);
  ASSERT_EQ(skipped.lines().size(), 1u);
  EXPECT_TRUE(Contains(skipped.lines()[0], small + ": 97x64 is smaller than the 100-pixel crop"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { decode_images(folder.files, DecodeOptions().size(64).resize(60)); }),
                       "60 is smaller than the 64-pixel crop"));
}

TEST(ImagePipeline, Bf16AndChannelsLastBatchesAreTheFloatOnesRoundedAndReordered) {
  PhotoFolder folder;
  const DecodeOptions options = DecodeOptions().size(20).mean({0.5, 0.4, 0.3}).std({0.2, 0.25, 0.3});
  const std::vector<Batch> planes = epoch_of(folder, options, 2);
  for (const auto& [dtype, channels_last] :
       std::vector<std::pair<torch::ScalarType, bool>>{{torch::kBFloat16, false}, {torch::kFloat, true},
                                                       {torch::kBFloat16, true}}) {
    for (int run = 0; run < 2; ++run) {  // and a second time: the pooled buffers give the same
      const std::vector<Batch> batches = epoch_of(folder, DecodeOptions(options).dtype(dtype).channels_last(channels_last), 2);
      ASSERT_EQ(batches.size(), planes.size());
      for (size_t b = 0; b < planes.size(); ++b) {
        EXPECT_EQ(batches[b].input.scalar_type(), dtype);
        EXPECT_EQ(batches[b].input.is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast
                                                               : at::MemoryFormat::Contiguous),
                  true);
        EXPECT_TRUE(torch::equal(batches[b].input, planes[b].input.to(dtype))) << b;  // the gray c.jpg included
      }
    }
  }
  EXPECT_TRUE(Contains(error_message<UsageError>(
                           [&] { decode_images(folder.files, DecodeOptions().dtype(torch::kHalf)); }),
                       "not float32 or bfloat16"));
}

TEST(ImagePipeline, ReducedDecodingStaysCloseToWholeDecoding) {
  PhotoFolder folder;
  const DecodeOptions options = DecodeOptions().size(48).flip(0);
  const std::vector<Batch> reduced = epoch_of(folder, options, 0), whole =
                                                                    epoch_of(folder, DecodeOptions(options).reduced_decode(false), 0);
  for (size_t b = 0; b < reduced.size(); ++b) {
    const torch::Tensor difference = (reduced[b].input - whole[b].input).abs();
    EXPECT_LT(difference.mean().item<float>(), 0.03f);  // of 0..1 pixels: a few levels of 255
    EXPECT_LT(difference.max().item<float>(), 0.35f);
  }
}

// One epoch of 3 batches of 2 images, built one at a time: what each batch held (cloned) and
// where its images were; `keep_view` holds a tensor on the first batch's storage through the epoch
// (as an alias made without a view, by set_ or a foreign array, would: not the batch itself).
struct PooledEpoch {
  std::vector<torch::Tensor> clones;
  std::vector<const void*> addresses;
  torch::Tensor view, view_clone;
};

PooledEpoch pooled_epoch(const PhotoFolder& folder, bool keep_view) {
  Loader loader(folder.files, LoaderOptions().batch_size(2).workers(0).seed(1), decode_images(folder.files,
                                                                                              DecodeOptions().size(8)));
  PooledEpoch epoch;
  for (Batch& batch : loader.epoch(0)) {
    epoch.clones.push_back(batch.input.clone());
    epoch.addresses.push_back(batch.input.data_ptr());
    if (keep_view && !epoch.view.defined()) {
      epoch.view = torch::empty({0}).set_(batch.input.storage(), 0, batch.input.sizes(), batch.input.strides());
      epoch.view_clone = epoch.view.clone();
    }
  }
  return epoch;
}

TEST(ImagePipeline, BatchBuffersAreReusedOnlyOnceNothingHoldsThem) {
  PhotoFolder folder;
  const PooledEpoch reused = pooled_epoch(folder, false);
  ASSERT_EQ(reused.addresses.size(), 3u);
  EXPECT_EQ(reused.addresses[2], reused.addresses[0]);  // the first batch, released, holds the third
  const PooledEpoch held = pooled_epoch(folder, true);
  EXPECT_NE(held.addresses[2], held.addresses[0]);      // its storage was still held
  EXPECT_TRUE(torch::equal(held.view, held.view_clone));
  for (size_t b = 0; b < 3; ++b) EXPECT_TRUE(torch::equal(held.clones[b], reused.clones[b])) << b;
}

TEST(ImagePipeline, ACorruptFileStopsTheEpochNamingIt) {
  PhotoFolder folder;
  const std::string path = folder.files->files().paths[4];
  const std::string bytes = testing::read_file(path);
  testing::write_file(path, bytes.substr(0, bytes.size() / 3));
  const std::string message = error_message<DataError>([&] { epoch_of(folder, DecodeOptions().size(16), 0); });
  EXPECT_TRUE(Contains(message, path + ": corrupt JPEG"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { decode_images(folder.files, DecodeOptions().channels(2)); }),
                       "channels"));
}

}  // namespace
}  // namespace afterburner::data
