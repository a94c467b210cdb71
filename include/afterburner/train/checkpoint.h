// Checkpoints: everything needed to resume a run exactly (model, optimizer, loss scaler, RNG,
// epoch, step and position in the epoch), written atomically: a crash or a full disk during
// the write leaves the previous checkpoint intact.
//
//   TrainState state{.epoch = 2, .step = 940, .batch_in_epoch = 470};
//   save_checkpoint("runs/ckpt.pt", {"cnn", model, *optimizer, scaler, state});
//   ...
//   TrainState resumed = load_checkpoint("runs/ckpt.pt", {"cnn", model, *optimizer, scaler, {}});
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

#include "afterburner/train/model.h"
#include "afterburner/train/precision.h"

namespace afterburner::train {

struct TrainState {
  int64_t epoch = 0;           // the epoch in progress
  int64_t step = 0;            // optimizer steps taken since the start of the run
  int64_t batch_in_epoch = 0;  // batches of `epoch` already consumed
  double train_seconds = 0;    // training time so far (for time-to-accuracy across resumes)
  double seconds_to_target = -1;  // training time when the target accuracy was reached; -1 = not yet
  int64_t samples = 0;            // samples trained since the start of the run
  int64_t samples_to_target = -1; // samples trained when the target accuracy was reached; -1 = not yet
  int64_t world_size = 1;         // data-parallel ranks of the run: their shards make the data order
};

// What a checkpoint holds besides the state; `model_name` guards against resuming another model.
struct CheckpointTarget {
  std::string model_name;
  Model model;  // shares the model: its tensors are written, or overwritten in place
  torch::optim::Optimizer& optimizer;
  GradScaler& scaler;
  TrainState state;
};

// Writes to `path` through a temporary file in the same directory, fsync and rename.
// Throws CheckpointError naming the path when anything fails; `path` is then untouched.
void save_checkpoint(const std::string& path, const CheckpointTarget& target);

// Restores model, optimizer, scaler and the CPU RNG in place and returns the saved state.
// Throws CheckpointError for a missing, corrupt or foreign file, or another model's checkpoint.
TrainState load_checkpoint(const std::string& path, CheckpointTarget target);

}  // namespace afterburner::train
