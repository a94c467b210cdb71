// The tune tests' recipe: the zoo's mlp on Fashion-MNIST, fp32, one thread, no loader workers,
// quiet; a test changes what it is about.
#pragma once

#include "afterburner/train/config.h"
#include "testing.h"

namespace afterburner::tune::testing_recipes {

inline train::TrainConfig small_mlp() {
  train::TrainConfig config;
  config.data = afterburner::testing::fashion_mnist_dir().string();
  config.model = "mlp";
  config.batch_size = 64;
  config.precision = "fp32";
  config.threads = 1;
  config.workers = 0;
  config.progress = "none";
  return config;
}

}  // namespace afterburner::tune::testing_recipes
