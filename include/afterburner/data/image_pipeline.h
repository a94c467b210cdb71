// Image files decoded and augmented per sample by the loader's workers, for image sets that are
// larger than memory at training size: torchvision's ImageFolder with RandomResizedCrop (or
// Resize + CenterCrop), RandomHorizontalFlip, ToTensor and Normalize, as one pass per image.
//
//   auto files = std::make_shared<ImageFiles>(list_image_folder("pets/train"));
//   Loader loader(files, LoaderOptions().batch_size(64).workers(2),
//                 decode_images(files, DecodeOptions().size(224).mean({0.485, 0.456, 0.406})
//                                                     .std({0.229, 0.224, 0.225})));
//   for (Batch& batch : loader.epoch(0)) ...   // float32 [64, 3, 224, 224], labels int64 [64]
//
// Per image: the crop box is drawn first (RandomResizedCrop's algorithm and defaults: area
// 8%-100% of the image, aspect ratio 3/4-4/3, 10 tries, then the centre; or the square that
// Resize + RandomCrop or CenterCrop keeps, in the stored image's pixels), then of a JPEG only the
// rows and 8-16 px blocks the box covers are decoded (DALI's region-of-interest decoding: the cost
// falls with the box's area), at 1/2, 1/4 or 1/8 of the size where the box still spans `size`
// pixels each way at that scale; then the box is resampled to size x size with
// the antialiased bilinear filter of PIL and torchvision (its support widened by the downscale),
// mirrored, scaled to [0, 1] and normalised, written straight into the batch (float32 or bfloat16,
// NCHW or channels_last). The randomness is a function of the loader's batch
// seed and the sample's position, as for every transform: the batches are the same for any worker
// count and on a second run.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/data/dataset.h"
#include "afterburner/data/image_file.h"
#include "afterburner/data/image_folder.h"
#include "afterburner/data/image_records.h"
#include "afterburner/data/transforms.h"

namespace afterburner::data {

// The box of each image resampled to the output: RandomResizedCrop's, or a square of the image
// resized (or not) to DecodeOptions::resize, at random (RandomCrop) or in the centre (CenterCrop).
enum class Crop { random_resized, random, centre };

struct DecodeOptions {
  // The side of the square images produced.
  TORCH_ARG(int64_t, size) = 224;
  TORCH_ARG(Crop, crop) = Crop::random_resized;
  // Crop::random and centre: the shorter side is resized to this before the crop (0: not resized;
  // an image smaller than `size` is then refused, naming it). Evaluation as torchvision's ImageNet
  // references: centre, resize size * 256 / 224.
  TORCH_ARG(int64_t, resize) = 0;
  TORCH_ARG(double, min_area) = 0.08;
  TORCH_ARG(double, max_area) = 1.0;
  TORCH_ARG(double, min_ratio) = 3.0 / 4.0;
  TORCH_ARG(double, max_ratio) = 4.0 / 3.0;
  // Probability of mirroring an image left-right (0 in evaluation).
  TORCH_ARG(double, flip) = 0.5;
  // Per channel, of pixels in [0, 1]; empty: not normalised.
  TORCH_ARG(std::vector<double>, mean) = {};
  TORCH_ARG(std::vector<double>, std) = {};
  // Output channels: 3 (grayscale images repeated, as PIL's convert("RGB")) or 1 (colour images
  // refused, or with gray_from_colour made their luma as PIL's convert("L"): (19595 R + 38470 G +
  // 7471 B + 32768) >> 16).
  TORCH_ARG(int64_t, channels) = 3;
  TORCH_ARG(bool, gray_from_colour) = false;
  // Decode of a JPEG only the rows and blocks the box covers, at a reduced DCT scale where the box
  // allows (off: always whole, slower).
  TORCH_ARG(bool, reduced_decode) = true;
  // The batches' element type, float32 or bfloat16 (each value rounded to nearest even, as
  // Tensor::to does: a bf16 model's first convolution under autocast sees the same bits), and
  // layout: channels_last when the model is, saving the loader a pass to reorder them.
  TORCH_ARG(torch::ScalarType, dtype) = torch::kFloat;
  TORCH_ARG(bool, channels_last) = false;
};

// The files of `list` that decode, each read whole once (a JPEG at 1/8 scale, which still reads
// all its compressed data), for a run that skips corrupt images (--skip-corrupt) and then decodes
// every epoch; the others, and those whose shorter side is below `min_side`, are recorded in
// `skipped` in file order and left out.
ImageFileList readable_images(const ImageFileList& list, SkippedInputs& skipped, int64_t min_side = 0);

// The transform that turns the batches of `records` (image files, or a pack) into
// [n, channels, size, size] images of options.dtype().
TransformPtr decode_images(std::shared_ptr<const ImageRecords> records, DecodeOptions options);

// The box resampled to size x size as the pipeline does it: float [C, size, size] in 0..255,
// equal to torchvision's resized_crop(antialias=True) of the float image to float rounding.
torch::Tensor resample_box(const Pixels& pixels, const Box& box, int64_t size);

}  // namespace afterburner::data
