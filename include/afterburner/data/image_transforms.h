// Image transforms written as a list, as users write torchvision's Compose: the CLI's
// `train --transforms`, Python's ImageFolder(transforms=...), and from C++:
//
//   ImageTransforms transforms = parse_image_transforms("resize256,crop224,flip");
//   auto train = decode_images(files, transforms.decode_options(true, 224).mean(m).std(s));
//   auto eval = decode_images(val, transforms.decode_options(false, 224).mean(m).std(s));
//   // eval: resize256,centre224, no flip
//
//   ImageTransforms cifar = parse_image_transforms("pad4,crop,flip");   // images held in memory
//   TransformPtr augment = compose({to_float(1.0 / 255), normalize(m, s), cifar.stored_transforms(32)});
//
// The list's items (torchvision's names in brackets); S may be left out where the image size is
// given elsewhere (--image-size):
//   rrcS[:MIN]  RandomResizedCrop(S, scale=(MIN, 1)), MIN 0.08 unless given
//   resizeR     Resize(R): the shorter side to R pixels, before a crop
//   cropS       RandomCrop(S): a random S x S square (of the resized image, or after pad)
//   centreS     CenterCrop(S) (also spelt centerS)
//   padP        RandomCrop(size, padding=P) with crop: P zero pixels around the image first
//   flip[:P]    RandomHorizontalFlip(P), P 0.5 unless given
// Images decoded each epoch (folders, packs) take rrc, or resize and then crop or centre, and flip;
// images held in memory at their size (IDX, CIFAR, arrays) take pad with crop, and flip. Each item
// appears once, resize before its crop and pad before crop. Evaluation takes the centre square of
// the same resize (rrc's: Resize(S * 256 / 224)), unflipped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "afterburner/data/image_pipeline.h"
#include "afterburner/data/transforms.h"

namespace afterburner::data {

struct ImageTransforms {
  // The crop (none: images as stored).
  std::optional<Crop> crop;
  int64_t size = 0;        // the crop's side; 0: the image size given elsewhere
  double min_area = 0.08;  // rrc's smallest share of the image
  int64_t resize = 0;      // the shorter side before the crop; 0: not resized
  int64_t padding = 0;     // zeros around a stored image before its random crop
  double flip = 0;         // probability of a left-right mirror
  std::string source = "transforms";  // what errors name: the option the list came from

  ImageTransforms& named(std::string option) {
    source = std::move(option);
    return *this;
  }

  // Whether the list crops or resizes images as they are decoded: they are then read each epoch.
  bool decodes() const;
  // The crop's side: `size` when the list gives one, else `image_size`. Throws UsageError when both
  // are given and differ.
  int64_t side(int64_t image_size) const;
  // Options of decode_images for images decoded each epoch at side(image_size): as listed in
  // training, and in evaluation the centre square of the same resize, unflipped. Throws
  // UsageError for a list that holds items only stored images take (pad).
  DecodeOptions decode_options(bool training, int64_t image_size) const;
  // The batch transforms of images held in memory at image_size x image_size (random_crop,
  // random_horizontal_flip; none: empty). Throws UsageError for items that need decoding.
  std::vector<TransformPtr> stored_transforms(int64_t image_size) const;
  // The list, written out in full ("rrc224:0.08,flip:0.5"); the evaluation list of decoded images
  // ("resize256,centre224").
  std::string describe(int64_t image_size) const;
  std::string describe_evaluation(int64_t image_size) const;
};

// `list` parsed; throws UsageError naming `what` (the option it came from) and the item for an
// unknown item, a bad number, an item given twice or out of order, or a resize without a crop.
// An empty list transforms nothing.
ImageTransforms parse_image_transforms(const std::string& list, const std::string& what = "transforms");

}  // namespace afterburner::data
