// CIFAR-10 and CIFAR-100 in their binary version (cifar-10-batches-bin, cifar-100-binary).
//
//   LabelledDataset train = load_cifar("cifar-10-batches-bin", Split::train);
//   train.dataset->size();   // 50000; inputs uint8 [N, 3, 32, 32], targets int64 in [0, 10)
//   train.classes;           // from batches.meta.txt: {"airplane", "automobile", ...}
//
// CIFAR-10: data_batch_1.bin ... data_batch_5.bin (train) and test_batch.bin, each record a label
// byte and 3,072 pixel bytes (the red, green and blue planes); class names from batches.meta.txt.
// CIFAR-100: train.bin and test.bin, each record a coarse and a fine label byte and the pixels;
// the fine labels (100 classes, names from fine_label_names.txt). Without a names file the
// classes are numbered. Throws DataError naming the file: missing, a size that is not a whole
// number of records, a label beyond the classes.
#pragma once

#include <string>

#include "afterburner/data/dataset.h"

namespace afterburner::data {

LabelledDataset load_cifar(const std::string& dir, Split split);

// Whether `dir` holds CIFAR-10's or CIFAR-100's binary batches.
bool is_cifar_folder(const std::string& dir);

}  // namespace afterburner::data
