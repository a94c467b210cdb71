// A folder of class folders (torchvision's ImageFolder layout), decoded into memory:
// pets/cat/001.jpg, pets/dog/002.png, ... (files in nested folders belong to their class folder).
//
//   LabelledDataset train = load_image_folder("pets/train");
//   train.classes;                                  // {"cat", "dog"}: label i is classes[i]
//   LabelledDataset val = load_image_folder("pets/val", ImageFolderOptions().classes(train.classes));
//   train.dataset->get_batch(indices).input;        // uint8 [n, C, S, S]
//
// As ImageFolder: classes are the sorted subfolder names, samples are in class order and, within a
// class, in sorted folder-then-file order; files are taken by extension (.jpg, .jpeg, .png in any
// case; image_file.h says what each becomes). Images are one channel when all are grayscale, else
// three (grayscale ones repeated, as PIL's convert("RGB")). Other image formats torchvision reads
// (.bmp, .gif, .ppm, .pgm, .tif, .tiff, .webp) are refused, naming the file, rather than skipped;
// files with any other extension are skipped, as ImageFolder skips them.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "afterburner/data/dataset.h"

namespace afterburner::data {

struct ImageFolderOptions {
  // The class names labels index, when given (a validation folder read with its training folder's
  // classes: a subfolder not among them is an error); otherwise the sorted subfolder names.
  TORCH_ARG(std::vector<std::string>, classes) = {};
  // The side of the square images returned. 0 keeps the stored size, which every image must then
  // share (square); otherwise each image's shorter side is resized to it (bilinear, antialiased:
  // torchvision's Resize on tensors, rounded to uint8) and the centre cropped to a square.
  TORCH_ARG(int64_t, image_size) = 0;
  // Where a corrupt or unreadable image, an empty class folder or a class folder outside
  // `classes` is recorded and left out (null: it is an error). An empty class keeps its label.
  TORCH_ARG(std::shared_ptr<SkippedInputs>, skipped);
};

// The image files of a class folder set and their labels, nothing decoded: the listing
// load_image_folder decodes (and image_pipeline.h's ImageFiles decodes per epoch). `classes` as
// ImageFolderOptions::classes. Throws DataError for no class folders, a class folder without
// images, a subfolder outside `classes`, or a refused image format, unless `skipped` is given (as
// ImageFolderOptions::skipped).
struct ImageFileList {
  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  std::vector<std::string> classes;
};
ImageFileList list_image_folder(const std::string& dir, const std::vector<std::string>& classes = {},
                                SkippedInputs* skipped = nullptr);

// Throws DataError naming the file or folder: no class folders, a class folder without images, an
// unreadable or corrupt image, or (when image_size is 0) images that are not squares of one size.
LabelledDataset load_image_folder(const std::string& dir, const ImageFolderOptions& options = ImageFolderOptions());

}  // namespace afterburner::data
