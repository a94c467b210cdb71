// What a training run reports: accuracy, speed, the time breakdown and memory.
//
//   TrainReport report = trainer.fit();
//   std::cout << report.summary();                       // the human-readable final report
//   std::ofstream("report.json") << report.to_json().dump(2);
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "afterburner/profile/step_timer.h"

namespace afterburner::train {

struct EvalResult {
  double accuracy = 0;
  double loss = 0;
  int64_t samples = 0;
};

// One evaluation during training: the points of the accuracy-against-time curve.
struct EvalPoint {
  int64_t step = 0;
  int64_t samples = 0;           // trained samples so far
  double train_seconds = 0;      // training time so far
  double accuracy = 0;
  double loss = 0;
};

// What averaging the gradients over the ranks cost per optimizer step, as c10d's Reducer
// measured it: from the first bucket's allreduce to the last one's end, and the part of that
// during which backward was still computing (hidden behind it).
struct CommunicationStats {
  double ms_per_step = 0;
  double hidden_ms_per_step = 0;
};

// What the run trained and evaluated on.
struct DataSummary {
  std::string format;  // of --data (data/sources.h), a pack's with how it stores images: "pack (raw, max side 256)"
  int64_t train_samples = 0, evaluation_samples = 0;
  std::vector<int64_t> sample;       // one sample's shape: [C, S, S] for images, [F] for a table's features
  std::vector<std::string> classes;  // label i is classes[i]
  // What batches are normalised by: per channel, of the training pixels in [0, 1]; or per feature.
  std::vector<double> mean, std;
  std::vector<std::string> skipped;  // with --skip-corrupt: each input left out, "source: problem"
  std::string order;                 // of the training samples: "exact shuffle", or block-local's, described
  // Augmentation of training images and evaluation's crop, as --transforms lists them (empty: none).
  std::string transforms, evaluation_transforms;
};

struct TrainReport {
  std::map<std::string, std::string> config;  // every TrainConfig field's text, when run_training() made it
  std::string model;
  std::string precision;
  int64_t batch_size = 0;
  int64_t threads = 0;
  int64_t workers = 0;
  int64_t world_size = 1;              // ranks training together; speeds and samples count them all
  std::optional<CommunicationStats> communication;  // with more than one rank
  int64_t trainable_parameters = 0;
  int64_t steps = 0;                   // optimizer steps taken (all sessions of a resumed run)
  int64_t skipped_steps = 0;           // steps dropped for an inf/NaN loss or gradient
  std::string evaluated_on = "test";   // "test", or "validation" (held out of the training set)
  DataSummary data;
  std::string schedule;                // the learning-rate schedule, described
  double test_accuracy = 0;            // of the last evaluation
  std::vector<double> test_accuracy_per_epoch;
  double train_samples_per_sec = 0;    // training steps only, data wait included, evaluation excluded
  std::vector<double> epoch_seconds;   // training time of each epoch run in this session
  double train_seconds = 0;            // training time of the whole run, across resumes
  std::optional<double> train_seconds_to_target;
  std::optional<int64_t> samples_to_target;
  double eval_seconds = 0;             // time spent evaluating (not in train_seconds)
  std::vector<EvalPoint> evaluations;  // of this session
  double peak_rss_mb = 0;
  double peak_tensor_mb = 0;
  std::string stop_reason;             // "completed", "target accuracy reached", "max steps", "interrupted", "failed", ...
  std::string error;                   // with "failed": where (step or evaluation, precision) and why
  std::optional<int64_t> checkpointed_step;  // the step of the last checkpoint this session wrote
  std::vector<std::string> written;    // "the model m.pt", "the report r.json": what run_training wrote at the end
  profile::StepStats timing;

  nlohmann::json to_json() const;
  std::string summary() const;   // multi-line text: accuracy, speed, time breakdown, memory
};

}  // namespace afterburner::train
