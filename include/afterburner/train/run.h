// A whole training run from a TrainConfig: data, loaders, model, optimizer, schedule,
// callbacks, resume, export and the JSON report. This is what `afterburner train` calls.
//
//   afterburner::train::TrainConfig config;
//   config.model = "cnn";
//   config.epochs = 1;
//   auto report = afterburner::train::run_training(config);
//   std::cout << report.summary();
#pragma once

#include <memory>
#include <string>

#include "afterburner/train/config.h"
#include "afterburner/train/history.h"
#include "afterburner/train/replicas.h"
#include "afterburner/train/report.h"

namespace afterburner::train {

// With `parallel`, one rank of data-parallel training (see TrainingSession); only rank 0 writes
// the report and the exported model. A run that stops early writes them too: one interrupted
// (Ctrl-C under a StopOnInterrupt) returns its report, stop_reason "interrupted"; one that
// fails after training (an evaluation or export error, a NaN loss) throws TrainingError naming
// the step, the precision and what was written (kept()). The run's curves go into `history`
// where given (a live dashboard reads it, rank 0 records), and a report path ending in .html is
// the dashboard page with them inside.
TrainReport run_training(const TrainConfig& config, const DataParallelism& parallel = {},
                         std::shared_ptr<TrainingHistory> history = nullptr);

// "wrote the checkpoint ck/checkpoint.pt of step 40 (--resume continues), the model m.pt and
// the report r.json": what `report` says the run wrote at its end.
std::string kept(const TrainConfig& config, const TrainReport& report);

// The checkpoint file inside a --checkpoint-dir.
std::string checkpoint_file(const std::string& checkpoint_dir);

}  // namespace afterburner::train
