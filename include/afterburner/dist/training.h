// `afterburner train` in any shape: one process; `--nproc N` local ranks of this same command;
// or one rank of a job, when torchrun's variables are set (by torchrun, a scheduler, or our own
// launcher). Ranks train with DataParallel on a Gloo group; rank 0 reports.
//
//   afterburner::train::TrainConfig config;
//   config.nproc = 2;
//   if (auto report = afterburner::dist::run_training(config)) std::cout << report->summary();
#pragma once

#include <optional>

#include "afterburner/dist/group.h"
#include "afterburner/train/config.h"
#include "afterburner/train/report.h"

namespace afterburner::dist {

// The report of the run, or of its rank 0; nullopt in a launcher (whose rank 0 printed its own)
// and on other ranks. Throws DistError naming the rank that failed.
std::optional<train::TrainReport> run_training(const train::TrainConfig& config);

// One rank of a job, joining it as `options` say (the timeout is config.dist_timeout).
std::optional<train::TrainReport> train_rank(const train::TrainConfig& config, GroupOptions options);

}  // namespace afterburner::dist
