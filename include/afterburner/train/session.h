// A training run from a TrainConfig, in two parts: the data it reads (loaded once, and shared by
// any number of sessions), and a session holding its loaders, model, optimizer and trainer.
// run_training() is one session's fit(); `afterburner tune` measures many sessions side by side.
//
//   auto data = afterburner::train::load_training_data(config);
//   afterburner::train::TrainingSession session(config, data);
//   auto speed = session.measure_steps(/*warmup=*/5, /*steps=*/40);   // samples/s of 40 steps
//   afterburner::train::TrainReport report = session.fit();
#pragma once

#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/data/dataset.h"
#include "afterburner/data/transforms.h"
#include "afterburner/sketch/plan.h"
#include "afterburner/train/callbacks.h"
#include "afterburner/train/config.h"
#include "afterburner/train/replicas.h"
#include "afterburner/train/report.h"

namespace afterburner::train {

struct TrainingData {
  data::DatasetPtr train;
  data::DatasetPtr evaluation;  // the test set, or the validation split held out of the training set
  std::string evaluated_on;     // "test" or "validation"
  std::string format;           // DataSummary::format
  bool block_local = false;     // the training order (data/loader.h, LoaderOptions::block_local)
  int64_t channels = 0, image_size = 0;
  int64_t features = 0;  // a table's features per sample (0: the data are images)
  // Per channel, of the training images scaled to [0, 1]; or per feature of a table's rows.
  std::vector<double> mean, std;
  std::vector<std::string> classes;  // label i is classes[i]
  // The transforms that turn the datasets' batches into the model's input, scaled, normalised and
  // augmented: image records decoded each epoch (whose batches are their indices), uint8 images,
  // or a table's rows.
  data::TransformPtr train_transform, evaluation_transform;
  // What they do to images, as --transforms lists (data/image_transforms.h): "rrc224:0.08,flip:0.5";
  // evaluation "resize256,centre224" (empty: images as stored).
  std::string transforms, evaluation_transforms;
  // With --skip-corrupt: the inputs left out (null: a bad input stops the run).
  std::shared_ptr<data::SkippedInputs> skipped;
};

// Whether --model names a TorchScript file to train (a path, or a name ending in .pt) rather
// than a zoo model.
bool is_model_file(const std::string& model);

// The TorchScript file config.model names, loaded to be trained in place, after one forward of
// two of `data`'s training images (in evaluation mode). Throws UsageError naming the file or flag
// when it cannot be: unreadable, nothing requires grad, a zoo-only option given, BatchNorm in a
// `data_parallel` job, or a forward that fails or does not give one logit per class. A launcher
// calls it once before starting its ranks.
torch::jit::Module load_user_model(const TrainConfig& config, const TrainingData& data, bool data_parallel);

// Reads config.data (in config.data_format, data/sources.h) and evaluates on config.val_data, a
// validation split held out of it (config.validation_split) or its test split. Throws UsageError /
// DataError naming the file or flag.
TrainingData load_training_data(const TrainConfig& config);

struct StepMeasurement {
  int64_t steps = 0;
  int64_t samples = 0;
  double seconds = 0;
  double samples_per_sec = 0;
  double peak_tensor_mb = 0;  // the largest live tensor memory during the timed steps
  bool diverged = false;      // a loss turned inf or NaN: the steps stopped there, the speed means nothing
};

class TrainingSession {
 public:
  // With `parallel.replicate`, one rank of data-parallel training: the model it builds is wrapped, the
  // training set sharded and the evaluation set split over the ranks, and only rank 0 reports
  // progress, logs and checkpoints.
  TrainingSession(const TrainConfig& config, const TrainingData& data, const DataParallelism& parallel = {});
  ~TrainingSession();
  TrainingSession(const TrainingSession&) = delete;
  TrainingSession& operator=(const TrainingSession&) = delete;

  // Trains as configured (epochs, target, checkpoints, callbacks); writes no files but the
  // checkpoints and the JSON lines log.
  TrainReport fit();

  // `warmup` untimed optimizer steps, then `steps` timed ones, over fresh epochs of the training
  // loader, with the session's threads; training continues from where the last call left it.
  StepMeasurement measure_steps(int64_t warmup, int64_t steps);

  // One optimizer step at each learning rate of `lrs` in turn (a range test), as measure_steps()
  // runs them; returns each step's mean training loss, ending early after the first that is not
  // finite.
  std::vector<double> losses_at(const std::vector<double>& lrs);

  void add_callback(CallbackPtr callback);  // observes fit()

  const TrainConfig& config() const;
  int64_t rank() const;  // 0 without replicas
  // What --sketch replaced in a zoo model and what it kept, with the reasons; null without it.
  const sketch::SketchReport* sketch_report() const;
  // Writes the trained model as TorchScript (torch.jit.load runs it): a zoo model as built (not
  // fused), or the user's TorchScript model in evaluation mode. Throws Error naming the path.
  void export_model(const std::string& path) const;

 private:
  struct Parts;
  std::unique_ptr<Parts> parts_;
};

}  // namespace afterburner::train
