#include <gtest/gtest.h>
#include <spng.h>
#include <torch/torch.h>
#include <turbojpeg.h>

#include "afterburner/core/error.h"
#include "afterburner/data/image_file.h"
#include "afterburner/data/image_folder.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

using testing::TempDir;

// A PNG of `samples` (HWC, 8 or 16 bits per sample, host-endian) written by libspng's encoder.
std::string png_bytes(const std::vector<uint8_t>& samples, uint32_t width, uint32_t height, uint8_t color_type,
                      uint8_t bit_depth) {
  spng_ctx* context = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(context, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr header{};
  header.width = width;
  header.height = height;
  header.color_type = color_type;
  header.bit_depth = bit_depth;
  spng_set_ihdr(context, &header);
  EXPECT_EQ(spng_encode_image(context, samples.data(), samples.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), 0);
  size_t size = 0;
  int error = 0;
  void* buffer = spng_get_png_buffer(context, &size, &error);
  std::string bytes(static_cast<const char*>(buffer), size);
  free(buffer);
  spng_ctx_free(context);
  return bytes;
}

// A JPEG of `pixels` (HWC, RGB or gray) written by libjpeg-turbo at quality 95.
std::string jpeg_bytes(const std::vector<uint8_t>& pixels, int width, int height, bool gray) {
  tjhandle handle = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(handle, pixels.data(), width, 0, height, gray ? TJPF_GRAY : TJPF_RGB, &buffer, &size,
                        gray ? TJSAMP_GRAY : TJSAMP_444, 95, 0),
            0);
  std::string bytes(reinterpret_cast<const char*>(buffer), size);
  tjFree(buffer);
  tjDestroy(handle);
  return bytes;
}

std::vector<uint8_t> ramp(size_t count, int step = 37) {
  std::vector<uint8_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<uint8_t>((i * step + i / 5) % 256);
  return values;
}

torch::Tensor decoded(const std::string& bytes) {
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test");
}

// HWC bytes as the [C, H, W] tensor the decoder returns, keeping the first `channels`.
torch::Tensor chw(std::vector<uint8_t> samples, int64_t height, int64_t width, int64_t stored, int64_t channels) {
  return torch::from_blob(samples.data(), {height, width, stored}, torch::kByte)
      .narrow(2, 0, channels)
      .permute({2, 0, 1})
      .clone();
}

TEST(ImageFile, PngOfEveryColourTypeDecodesToItsSamples) {
  const std::vector<uint8_t> rgb = ramp(5 * 3 * 3), rgba = ramp(4 * 6 * 4), gray = ramp(7 * 2), ga = ramp(3 * 3 * 2);
  EXPECT_TRUE(torch::equal(decoded(png_bytes(rgb, 3, 5, SPNG_COLOR_TYPE_TRUECOLOR, 8)), chw(rgb, 5, 3, 3, 3)));
  EXPECT_TRUE(
      torch::equal(decoded(png_bytes(rgba, 6, 4, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8)), chw(rgba, 4, 6, 4, 3)));
  EXPECT_TRUE(torch::equal(decoded(png_bytes(gray, 2, 7, SPNG_COLOR_TYPE_GRAYSCALE, 8)), chw(gray, 7, 2, 1, 1)));
  EXPECT_TRUE(
      torch::equal(decoded(png_bytes(ga, 3, 3, SPNG_COLOR_TYPE_GRAYSCALE_ALPHA, 8)), chw(ga, 3, 3, 2, 1)));
}

TEST(ImageFile, SixteenBitPngRoundsToEightBits) {
  std::vector<uint16_t> wide{0, 1, 128, 129, 257, 32767, 32768, 65279, 65534, 65535};
  std::vector<uint8_t> raw(wide.size() * 2);
  std::memcpy(raw.data(), wide.data(), raw.size());
  std::vector<uint8_t> expected;
  for (uint16_t v : wide) expected.push_back(static_cast<uint8_t>(std::lround(v * 255.0 / 65535.0)));
  EXPECT_TRUE(torch::equal(decoded(png_bytes(raw, 5, 2, SPNG_COLOR_TYPE_GRAYSCALE, 16)), chw(expected, 2, 5, 1, 1)));
  std::vector<uint8_t> color(2 * 2 * 4 * 2);
  std::memcpy(color.data(), wide.data(), std::min(color.size(), raw.size()));
  torch::Tensor rgb = decoded(png_bytes(color, 2, 2, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 16));
  EXPECT_EQ(rgb.sizes(), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(rgb[0][0][0].item<int>(), 0);   // sample 0
  EXPECT_EQ(rgb[1][0][0].item<int>(), 0);   // 1 -> 0
  EXPECT_EQ(rgb[2][0][0].item<int>(), 0);   // 128 -> 0.498 -> 0
  EXPECT_EQ(rgb[0][0][1].item<int>(), 1);   // sample 4: 257 -> 1
}

TEST(ImageFile, JpegRoundTripsCloselyAndGrayStaysOneChannel) {
  const int width = 16, height = 8;
  std::vector<uint8_t> smooth(width * height * 3);
  for (int i = 0; i < width * height * 3; ++i) smooth[i] = static_cast<uint8_t>(64 + (i % (width * 3)) * 2);
  torch::Tensor rgb = decoded(jpeg_bytes(smooth, width, height, false));
  ASSERT_EQ(rgb.sizes(), (std::vector<int64_t>{3, height, width}));
  EXPECT_LE((rgb.to(torch::kInt) - chw(smooth, height, width, 3, 3).to(torch::kInt)).abs().max().item<int>(), 6);
  std::vector<uint8_t> gray(smooth.begin(), smooth.begin() + width * height);
  torch::Tensor one = decoded(jpeg_bytes(gray, width, height, true));
  EXPECT_EQ(one.sizes(), (std::vector<int64_t>{1, height, width}));
  EXPECT_TRUE(torch::equal(one, decoded(jpeg_bytes(gray, width, height, true))));  // a second call: the same
}

TEST(ImageFile, BadBytesAreOneLineNamingTheSource) {
  const std::string png = png_bytes(ramp(4 * 4 * 3), 4, 4, SPNG_COLOR_TYPE_TRUECOLOR, 8);
  const std::string jpeg = jpeg_bytes(ramp(8 * 8 * 3), 8, 8, false);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", "not a JPEG or PNG image"},
      {"GIF89a", "not a JPEG or PNG image"},
      {png.substr(0, 12), "corrupt PNG"},
      {png.substr(0, png.size() - 16), "corrupt PNG"},
      {jpeg.substr(0, 4), "corrupt JPEG"},
      {jpeg.substr(0, jpeg.size() / 2), "corrupt JPEG"},
  };
  for (const auto& [content, problem] : cases) {
    const std::string& bytes = content;  // a structured binding cannot be captured in C++17
    const std::string message = error_message<DataError>([&] { decoded(bytes); });
    EXPECT_TRUE(Contains(message, "test: " + problem));
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  std::string huge = png;  // the IHDR's width set to 2^30: refused before its pixels are allocated
  huge[16] = 0x40;
  EXPECT_TRUE(Contains(error_message<DataError>([&] { decoded(huge); }), "test: corrupt PNG"));
  // A header cut short that claims 122 x 1,769,472 16-bit pixels (the image fuzzer's find): 30
  // bytes cannot hold them, refused before 648 MB are allocated for them.
  const std::string claims_much("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x7a\0\x1b\0\0\x10\x02\0\0\0\x6f", 30);
  EXPECT_TRUE(Contains(error_message<DataError>([&] { decoded(claims_much); }),
                       "test: corrupt PNG: its header declares 122x1769472 pixels, more than its 30 bytes can hold"));
  std::string vast = jpeg;  // its frame header's height and width set to 60000: refused before decoding
  const size_t frame = vast.find("\xFF\xC0");
  ASSERT_NE(frame, std::string::npos);
  vast.replace(frame + 5, 4, "\xEA\x60\xEA\x60");
  EXPECT_TRUE(Contains(error_message<DataError>([&] { decoded(vast); }), "60000x60000 pixels: more than"));
  TempDir dir;
  EXPECT_TRUE(Contains(error_message<DataError>([&] { decode_image_file((dir / "missing.png").string()); }),
                       "missing.png: no such file"));
}

TEST(ImageFolder, ClassesAreSortedFoldersAndSamplesFollowThem) {
  TempDir dir;
  const std::string red = png_bytes(std::vector<uint8_t>(4 * 4 * 3, 200), 4, 4, SPNG_COLOR_TYPE_TRUECOLOR, 8);
  const std::string dark = png_bytes(std::vector<uint8_t>(4 * 4, 10), 4, 4, SPNG_COLOR_TYPE_GRAYSCALE, 8);
  std::filesystem::create_directories(dir / "zebra" / "nested");
  std::filesystem::create_directories(dir / "ant");
  testing::write_file(dir / "zebra" / "b.png", red);
  testing::write_file(dir / "zebra" / "nested" / "a.PNG", dark);
  testing::write_file(dir / "zebra" / "readme.txt", "skipped");
  testing::write_file(dir / "ant" / "x.png", dark);
  const LabelledDataset folder = load_image_folder(dir.path().string());
  EXPECT_EQ(folder.classes, (std::vector<std::string>{"ant", "zebra"}));
  const Batch all = folder.dataset->get_batch(torch::arange(3));
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({0, 1, 1}, torch::kLong)));
  ASSERT_EQ(all.input.sizes(), (std::vector<int64_t>{3, 3, 4, 4}));  // colour in the set: gray repeated
  EXPECT_EQ(all.input[0].min().item<int>(), 10);
  EXPECT_EQ(all.input[1].min().item<int>(), 200);  // zebra/b.png before zebra/nested/a.PNG, as os.walk
  EXPECT_EQ(all.input[2].max().item<int>(), 10);
  const LabelledDataset mapped = load_image_folder(dir.path().string(),
                                                   ImageFolderOptions().classes({"zebra", "ant", "bee"}));
  EXPECT_TRUE(torch::equal(mapped.dataset->get_batch(torch::arange(3)).target, torch::tensor({1, 0, 0}, torch::kLong)));
  EXPECT_TRUE(Contains(error_message<DataError>([&] {
                         load_image_folder(dir.path().string(), ImageFolderOptions().classes({"zebra"}));
                       }),
                       "ant: a class the training images do not have (zebra)"));
}

}  // namespace
}  // namespace afterburner::data
