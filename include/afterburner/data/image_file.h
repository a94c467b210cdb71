// Image files decoded to uint8 pixels: JPEG through libjpeg-turbo, PNG through libspng.
//
//   torch::Tensor pixels = decode_image_file("pets/cat/001.jpg");   // uint8 [C, H, W], C = 1 or 3
//
// What a file becomes (torchvision's ImageFolder reads through PIL's convert("RGB"); the same
// pixels, except that grayscale stays one channel here and is widened by the folder reader only
// when other images of the set are in colour):
// - grayscale JPEG, grayscale PNG (with or without alpha): one channel;
// - colour JPEG (YCbCr or RGB), RGB and palette PNG (with or without alpha): three channels, RGB;
// - alpha (and a tRNS chunk) dropped, not composited, as convert("RGB") does;
// - 16-bit PNG samples rounded to 8 bits (v * 255 / 65535); gray below 8 bits scaled to 0..255;
// - CMYK and YCCK JPEGs refused (their colour conversion depends on the producing software).
// Any other content, a truncated or corrupt file, or an empty image throws DataError naming it.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace afterburner::data {

// Decoded pixels, interleaved (HWC), 1 or 3 channels as above: the whole image, or the part of it
// that starts at (left, top).
struct Pixels {
  std::vector<uint8_t> hwc;
  int64_t height = 0, width = 0, channels = 0;
  int64_t left = 0, top = 0;
};

struct ImageSize {
  int64_t width = 0, height = 0;
  bool partial_decoding = false;  // whether decode_pixels honours `eighths` and `region` (JPEG)
};

// A box of an image, in its pixels.
struct Box {
  int64_t x = 0, y = 0, width = 0, height = 0;
};

// The stored size, from the header alone.
ImageSize read_image_size(const uint8_t* bytes, size_t size, const std::string& source);

// Decodes the bytes at eighths/8 of the stored size in each dimension, rounded up: a JPEG through
// libjpeg-turbo's DCT scaling, which costs less than decoding it whole and resizing (a PNG is
// always decoded whole: check the returned size).
Pixels decode_pixels(const uint8_t* bytes, size_t size, const std::string& source, int eighths = 8);
// The same into `into`, reusing its memory (a loader's worker decodes thousands of images); of a
// JPEG only `region` of the scaled image when given (its rows, and its columns widened to whole
// blocks: see into.left and into.top), which costs less in proportion. The rows below the region
// are not read, so damage there goes unseen; a PNG is always decoded whole.
void decode_pixels(const uint8_t* bytes, size_t size, const std::string& source, int eighths, Pixels& into,
                   const Box* region = nullptr);

// The pixels encoded as a baseline JPEG at `quality` (1-100; libjpeg's defaults otherwise: 4:2:0
// chroma for colour, as PIL's save). Throws DataError naming `source` if libjpeg fails.
std::vector<uint8_t> encode_jpeg(const Pixels& pixels, int quality, const std::string& source);

// Decodes `path` (JPEG or PNG, told apart by their signatures, not the file name).
torch::Tensor decode_image_file(const std::string& path);

// Decodes the encoded bytes of one image; `source` names them in errors.
torch::Tensor decode_image(const uint8_t* bytes, size_t size, const std::string& source);

}  // namespace afterburner::data
