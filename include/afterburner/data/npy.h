// NumPy arrays: .npy files, .npz archives (np.savez and np.savez_compressed), and image datasets
// stored as arrays in Keras's layout (x_train, y_train, x_test, y_test: keras.datasets' mnist.npz).
//
//   torch::Tensor a = read_npy("features.npy");                    // its dtype and shape
//   auto arrays = read_npz("mnist.npz");                          // {"x_train": ..., ...}
//   LabelledDataset train = load_array_images("mnist.npz", Split::train);
//
// Element types: bool, int8/16/32/64, uint8, float16/32/64, either byte order; C or Fortran order.
// Throws DataError naming the file (and the array in an archive): bad magic or header, an
// unsupported type, truncated data or trailing bytes.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>

#include "afterburner/data/dataset.h"

namespace afterburner::data {

torch::Tensor read_npy(const std::string& path);

// The archive's arrays by name (without ".npy").
std::map<std::string, torch::Tensor> read_npz(const std::string& path);

// x_{train,test} and y_{train,test} from `path`: an .npz archive holding them, or a folder of
// x_train.npy, y_train.npy, x_test.npy, y_test.npy. Images must be uint8: [N, H, W] (grayscale),
// [N, H, W, C] or [N, C, H, W] with C of 1 or 3 and square H = W; labels a 1-D integer array of
// N values from 0. The classes are numbered up to the largest training label (as Keras's
// to_categorical counts them); a test label beyond them is an error naming the array, or with
// `skipped` recorded there and its sample left out.
LabelledDataset load_array_images(const std::string& path, Split split, SkippedInputs* skipped = nullptr);

// Whether `path` is an .npz file or a folder holding x_train.npy.
bool is_array_dataset(const std::string& path);

}  // namespace afterburner::data
