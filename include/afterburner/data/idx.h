// IDX files (the MNIST family's format), raw or gzip-compressed, and the MNIST layout.
//
//   torch::Tensor labels = read_idx("/data/train-labels-idx1-ubyte.gz");   // uint8 [60000]
//   DatasetPtr train = load_mnist("/usr/share/datasets/fashion-mnist", Split::train, /*classes=*/10);
//   train->size();   // 60000; inputs uint8 [N, 1, 28, 28], targets int64 [N] in [0, 10)
#pragma once

#include <torch/types.h>

#include <string>

#include "afterburner/data/dataset.h"

namespace afterburner::data {

// Any IDX element type (uint8, int8, int16, int32, float32, float64) and dimension count.
// Throws DataError naming the file for a missing file, bad magic, unknown type, truncated
// header or data, trailing bytes, or corrupt gzip data.
torch::Tensor read_idx(const std::string& path);

// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte, preferring the raw file and
// falling back to the .gz one. Checks the images are uint8 [N, 28, 28], the labels uint8
// [N], that the counts agree and, when `classes` > 0 (the model's outputs), that every label
// is one of the classes (check_labels).
DatasetPtr load_mnist(const std::string& dir, Split split, int64_t classes = 0);

}  // namespace afterburner::data
