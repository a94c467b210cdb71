// A small learnable problem for training tests: 8x8 single-channel "images" whose class (of 4)
// is the quadrant with the largest sum.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "afterburner/data/dataset.h"

namespace afterburner::train {

inline data::DatasetPtr quadrant_dataset(int64_t n, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto images = torch::rand({n, 1, 8, 8}, generator);
  auto sums = images.reshape({n, 2, 4, 2, 4}).sum({2, 4}).reshape({n, 4});
  return std::make_shared<data::TensorDataset>(images, sums.argmax(1));
}

}  // namespace afterburner::train
