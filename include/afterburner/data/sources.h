// The datasets `afterburner train --data PATH` reads, told apart by what PATH holds or named by
// --data-format: all give square uint8 images [N, C, S, S] (or a table's features, float [N, F])
// and their classes.
//
//   DataFormat format = detect_data_format("pets");          // DataFormat::folder
//   LabelledDataset train = load_images("pets", format, Split::train);
//
//   idx     a folder of MNIST-layout IDX files (idx.h), 10 classes as in the MNIST family
//   folder  class folders of JPEG/PNG images (image_folder.h); with train/ and val/ (or test/)
//           folders inside, those are the splits, else the folder itself is the only set
//   cifar   CIFAR-10/100 binary batches (cifar.h)
//   npy     an .npz archive or a folder of .npy arrays in Keras's layout (npy.h)
//   csv     a CSV (or TSV) file, or a folder holding a *train.csv and a *test.csv (csv.h:
//           load_csv_table)
//   pack    an .abpk file of images packed from an image folder (pack.h): one set
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "afterburner/data/dataset.h"
#include "afterburner/data/image_records.h"

namespace afterburner::data {

enum class DataFormat { idx, folder, cifar, npy, csv, pack };

// "idx", "folder", "cifar", "npy", "csv", "pack"; throws UsageError naming --data-format for anything else.
DataFormat parse_data_format(const std::string& name);
const char* data_format_name(DataFormat format);

// Throws DataError naming `path` when it holds none of the formats.
DataFormat detect_data_format(const std::string& path);

// Whether an image folder holds its splits as train/ and val/ (or test/) folders.
bool has_split_folders(const std::string& dir);

// Whether the dataset at `path` holds a test split beside its training one: not a single image
// folder or CSV file, which need a separate evaluation set or a validation split.
bool holds_test_split(const std::string& path, DataFormat format);

// The folder of an image folder's split: its train/ or val/ (else test/) folder when it has them,
// else the folder itself.
std::string image_folder_split(const std::string& dir, Split split);

struct SourceOptions {
  // The square side image folders are resized and cropped to (0: as stored); the other formats
  // store one size, which it must then equal.
  TORCH_ARG(int64_t, image_size) = 0;
  // The training set's, when loading an evaluation set: an image folder's subfolders are labelled
  // by them; the other formats store labels as numbers, and a CSV file's classes count them.
  TORCH_ARG(std::vector<std::string>, classes);
  // A CSV file's label column, by header name or index (empty: load_csv_table's choice).
  TORCH_ARG(std::string, label_column);
  // Where an image folder's corrupt images and empty class folders, a CSV file's bad rows and
  // arrays' labels outside the classes are recorded and left out (null: they are errors). Damage
  // to an IDX or CIFAR file is to the whole file.
  TORCH_ARG(std::shared_ptr<SkippedInputs>, skipped);
};

// The images of `split` of an image folder or a pack, to be decoded each epoch (image_pipeline.h),
// with the training set's `classes` when opening an evaluation set (a pack must hold the same).
// With `skipped`, an image folder's files are all decoded once, the corrupt ones and those whose
// shorter side is below `min_side` (the crop, when it is cut from the stored pixels) left out.
std::shared_ptr<const ImageRecords> open_image_records(const std::string& path, DataFormat format, Split split,
                                                       const std::vector<std::string>& classes = {},
                                                       const std::shared_ptr<SkippedInputs>& skipped = nullptr,
                                                       int64_t min_side = 0);

// `split` of the dataset at `path`.
LabelledDataset load_images(const std::string& path, DataFormat format, Split split,
                            const SourceOptions& options = SourceOptions());

}  // namespace afterburner::data
