// A whole training run from a TrainConfig: data, loaders, model, optimizer, schedule,
// callbacks, resume, export and the JSON report. This is what `afterburner train` calls.
//
//   afterburner::train::TrainConfig config;
//   config.model = "cnn";
//   config.epochs = 1;
//   auto report = afterburner::train::run_training(config);
//   std::cout << report.summary();
#pragma once

#include <string>

#include "afterburner/train/config.h"
#include "afterburner/train/replicas.h"
#include "afterburner/train/report.h"

namespace afterburner::train {

// With `parallel`, one rank of data-parallel training (see TrainingSession); only rank 0 writes
// the report and the exported model.
TrainReport run_training(const TrainConfig& config, const DataParallelism& parallel = {});

// The checkpoint file inside a --checkpoint-dir.
std::string checkpoint_file(const std::string& checkpoint_dir);

}  // namespace afterburner::train
