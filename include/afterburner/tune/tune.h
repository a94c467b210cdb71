// Which training techniques and which recipe make *this* model good enough soonest on *this*
// machine. Two objectives:
// - throughput: short trials of every technique that applies, each measured against the user's
//   configuration in alternating pairs (median with min and max), batch sizes under a memory
//   budget, and a recommended configuration measured against the best single technique;
// - time to accuracy: a search over the recipe (learning rate, schedule length, batch size,
//   momentum, warm-up, weight decay, augmentation, precision), each trial trained to the target on
//   a validation split held out of the training set, and the result measured on the test set.
// Either can start with a learning-rate range test (lr_find.h).
//
//   afterburner::train::TrainConfig base;          // the user's options, e.g. from the CLI
//   auto result = afterburner::tune::tune_throughput(base, afterburner::tune::TuneOptions().time_budget(300));
//   std::cout << afterburner::tune::format_table(result);
//   std::cout << afterburner::train::to_toml(result.recommended, &base);   // for --config
#pragma once

#include <torch/arg.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "afterburner/train/config.h"
#include "afterburner/train/report.h"
#include "afterburner/tune/lr_find.h"

namespace afterburner::tune {

using StopFlag = const std::atomic<bool>*;

struct TuneOptions {
  // Seconds for all trials and accuracy checks, roughly: trials shrink to fit it down to their
  // fewest steps (a budget below that is noted), and an accuracy check that would overrun it is
  // not run (noted; the setting it would have checked is not recommended).
  TORCH_ARG(double, time_budget) = 300;
  TORCH_ARG(int64_t, rounds) = 3;             // alternating pairs per trial
  TORCH_ARG(double, memory_budget_mb) = 0;    // 0 = no limit; batch sizes predicted above it are not tried
  TORCH_ARG(bool, check_accuracy) = true;     // false: never recommend what changes numerics
  TORCH_ARG(bool, lr_find) = false;           // run the range test first, within the budget
  TORCH_ARG(LrFindOptions, lr_find_options) = LrFindOptions();
  TORCH_ARG(StopFlag, stop) = nullptr;  // set (e.g. by SIGINT) to end after the current measurement
  TORCH_ARG(std::function<void(const std::string&)>, log) = nullptr;  // a line per finished trial
};

struct Spread {
  double median = 0, min = 0, max = 0;
};

// One setting of one technique, measured against the baseline in alternating pairs.
struct Trial {
  std::string technique;       // e.g. "precision"
  std::string setting;         // e.g. "fp32"
  train::TrainConfig config;   // the baseline with this setting
  Spread samples_per_sec;      // of this setting
  Spread baseline_samples_per_sec;  // of the baseline, in the same pairs
  Spread speedup;              // pair by pair: this over the baseline
  double peak_tensor_mb = 0;
  bool changes_numerics = false;  // precision, batch size: recommended only after an accuracy check
  std::string verdict;         // "faster", "slower", "no measurable gain" (the pairs' range straddles 1)
};

// Validation accuracy after one epoch on a 10% split, of a setting that changes numerics and of
// the baseline in fp32.
struct AccuracyCheck {
  std::string setting;
  double accuracy = 0, fp32_accuracy = 0;
  bool passed = false;  // accuracy >= fp32_accuracy - 0.005
};

// A recipe trained until it reaches the target accuracy, or until it can no longer beat the best.
struct RecipeTrial {
  std::string change;              // e.g. "lr=0.2", or "baseline"
  train::TrainConfig config;
  std::string evaluated_on;        // "validation" while searching, "test" for the final figures
  std::optional<double> seconds_to_target;  // training time, evaluation excluded
  std::optional<int64_t> samples_to_target;
  double best_accuracy = 0;
  double train_seconds = 0;        // of the whole trial
  std::vector<train::EvalPoint> evaluations;
  std::string verdict;             // "adopted", "not faster", "not reached: ...", "baseline"
};

struct TuneResult {
  std::string objective = "throughput";  // or "time-to-accuracy"
  train::TrainConfig baseline;
  train::TrainConfig recommended;
  std::vector<Trial> trials;
  Trial final_comparison;           // all faster settings together (technique kAllFasterTogether), against the baseline
  std::optional<Trial> recommended_trial;  // what `recommended` applies: a single setting's trial or final_comparison
  std::string kept_because;         // throughput, no recommended_trial: why the options given are kept
  std::string best_single;          // the fastest single trial, "technique=setting"
  double best_single_speedup = 1;   // its median speedup
  double baseline_peak_tensor_mb = 0;
  std::vector<std::string> notes;   // what was skipped, and why
  std::vector<AccuracyCheck> accuracy_checks;  // of each recommendation considered that changes numerics
  bool interrupted = false;
  std::optional<LrFindResult> lr_find;
  // time to accuracy: the search's trials on the validation split, in order, and the baseline's
  // and the recommendation's final runs on the test set.
  std::vector<RecipeTrial> recipe_trials;
  std::vector<RecipeTrial> on_test;

  nlohmann::json to_json() const;
};

// The technique of TuneResult::final_comparison.
inline constexpr const char* kAllFasterTogether = "all faster together";

// UsageError naming the flag for a time budget that is not a positive number of seconds, a
// negative memory budget or no rounds; both tunes call it first.
void validate(const TuneOptions& options);

TuneResult tune_throughput(const train::TrainConfig& base, const TuneOptions& options);

// Single runs of one recipe differ by up to this much in training time here: a change that alters
// the cost of a sample (batch size, precision, augmentation) must reach the target faster by more
// than this; any other is judged by samples to the target, a count free of timing noise.
inline constexpr double kRecipeNoise = 0.05;

// Needs base.target_accuracy. Trials evaluate on base.validation_split of the training set (0.1
// when not set); a trial stops once it runs past the best time so far.
TuneResult tune_time_to_accuracy(const train::TrainConfig& base, const TuneOptions& options);

// The terminal table: technique, setting, samples/s median [min-max], speedup, peak memory, verdict;
// then the notes.
std::string format_table(const TuneResult& result);

// What recommended.toml changes against the options given, in one line: "fuse=false: 1.06x the
// samples/s of the options given", or "the options given, unchanged: no setting was measurably faster".
std::string recommendation(const TuneResult& result);

// The lines after the table: the recommendation, and DIR/recommended.toml with the options it sets.
std::string format_recommendation(const TuneResult& result, const std::string& dir);

// DIR/tune.json, DIR/recommended.toml and DIR/report.md with its SVG plots. Creates DIR.
void write_report(const TuneResult& result, const std::string& dir);

}  // namespace afterburner::tune
