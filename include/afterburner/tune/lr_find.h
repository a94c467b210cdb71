// The learning-rate range test (Smith, "Cyclical Learning Rates for Training Neural Networks",
// 2017; fast.ai's lr_find): from fresh weights, one optimizer step at each learning rate of a
// geometric sweep, the loss smoothed by a bias-corrected moving average, cut where it diverges.
//
//   auto data = afterburner::train::load_training_data(config);
//   auto found = afterburner::tune::find_lr(config, data, afterburner::tune::LrFindOptions().steps(100));
//   fmt::print("try lr {} ({})\n", found.suggestion, found.stop_reason);
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "afterburner/train/config.h"
#include "afterburner/train/session.h"

namespace afterburner::tune {

struct LrFindOptions {
  TORCH_ARG(double, min_lr) = 1e-5;
  TORCH_ARG(double, max_lr) = 10;
  TORCH_ARG(int64_t, steps) = 100;
  TORCH_ARG(double, smoothing) = 0.98;  // the moving average's weight of the past
  TORCH_ARG(double, divergence) = 4;    // the curve ends where the smoothed loss passes this times its minimum
};

struct LrFindResult {
  std::vector<double> lrs, losses, smoothed;  // one per step of the curve
  double min_loss_lr = 0;  // where the smoothed loss is lowest
  // A tenth of min_loss_lr: the loss still falls fast there, and training at it stays stable.
  double suggestion = 0;
  std::string stop_reason;  // e.g. "the loss diverged at lr 2.5"

  nlohmann::json to_json() const;
};

// Uses `config` as it is (model, batch size, optimizer, momentum, precision); its lr and schedule
// are replaced by the sweep. Throws UsageError for a sweep that is not increasing or too short.
LrFindResult find_lr(const train::TrainConfig& config, const train::TrainingData& data,
                     const LrFindOptions& options = LrFindOptions());

}  // namespace afterburner::tune
