#include "afterburner/tune/tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <set>

#include "afterburner/core/error.h"
#include "afterburner/core/threads.h"
#include "afterburner/profile/alternate.h"
#include "afterburner/train/session.h"
#include "changes.h"

namespace afterburner::tune {
namespace {

using train::TrainConfig;
using train::TrainingSession;

constexpr int64_t kWarmupSteps = 2;        // untimed before every measurement (the loader's start)
constexpr int64_t kSessionWarmupSteps = 5; // untimed once per session: oneDNN primitives, page faults
constexpr int64_t kFewestSteps = 5;        // timed per measurement, whatever the budget
constexpr double kTrialShare = 0.8;        // of the time budget; the rest checks accuracy
constexpr double kAccuracyTolerance = 0.005;
constexpr double kValidationSplit = 0.1;    // held out of the training set by accuracy checks

struct Candidate {
  std::string technique;
  Changes changes;
  bool changes_numerics = false;
};

// Every technique that applies to `base`, each setting differing from it.
std::vector<Candidate> candidates(const TrainConfig& base, std::vector<std::string>& notes) {
  std::vector<Candidate> list;
  const std::string precision_now = effective_precision(base);
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    if (precision == precision_now) continue;
    if (!precision_runs(precision)) {
      notes.push_back(fmt::format("precision {}: not run, this CPU or LibTorch build does not compute it", precision));
      continue;
    }
    list.push_back({"precision", {{"precision", precision}}, /*numerics=*/true});
  }
  list.push_back({"fuse", {{"fuse", base.fuse ? "false" : "true"}}});
  if (base.model != "mlp") list.push_back({"layout", {{"channels_last", base.channels_last ? "false" : "true"}}});
  const int cores = available_cores();
  for (int workers = 0; workers <= cores; ++workers) {
    if (workers != base.workers) list.push_back({"loader workers", {{"workers", std::to_string(workers)}}});
  }
  const int64_t base_threads = base.threads > 0 ? base.threads : cores;
  for (int threads = 1; threads <= cores; ++threads) {
    if (threads != base_threads) list.push_back({"intra-op threads", {{"threads", std::to_string(threads)}}});
  }
  if (base.batch_size % 2 == 0) {
    list.push_back({"gradient accumulation",
                    {{"accumulate", std::to_string(2 * base.accumulate)}, {"batch_size", std::to_string(base.batch_size / 2)}}});
  }
  if (train::is_model_file(base.model)) {
    notes.push_back("activation checkpointing and sketching: not run, they rewrite zoo models and " + base.model +
                    " is trained as written");
  } else {
    // Memory against time: the first layer, whose activations are the largest in a CNN and which
    // exists whatever fusion makes of the rest.
    list.push_back({"activation checkpointing", {{"checkpoint_layers", "0"}}});
    if (!base.sketch) list.push_back({"sketching", {{"sketch", "true"}}, /*numerics=*/true});
  }
  notes.push_back("freed-memory policy: process-wide, so not alternated here; bench/ablation.py measures it (on by default)");
  return list;
}

Spread spread(const std::vector<double>& values) {
  auto s = profile::spread_of(values);
  return {s.median, s.min, s.max};
}

std::string verdict(const Spread& speedup) {
  if (speedup.min > 1) return "faster";
  if (speedup.max < 1) return "slower";
  return "no measurable gain";
}

class Tuner {
 public:
  Tuner(const TrainConfig& user, const TuneOptions& options)
      : options_(options),
        start_(std::chrono::steady_clock::now()),
        user_(user),
        base_(trial_base(user)),
        data_(train::load_training_data(base_)) {}

  TuneResult run() {
    result_.recommended = base_;
    if (options_.lr_find()) result_.lr_find = find_lr(base_, data_, options_.lr_find_options());
    baseline_ = std::make_unique<TrainingSession>(base_, data_);
    baseline_->measure_steps(kSessionWarmupSteps, 0);
    const auto calibration = baseline_->measure_steps(kWarmupSteps, 10);
    const double step_seconds = calibration.seconds / 10;
    sample_seconds_ = step_seconds / double(base_.batch_size * base_.accumulate);
    baseline_peak_mb_ = calibration.peak_tensor_mb;
    auto list = candidates(base_, result_.notes);
    add_batch_sizes(list);
    seconds_per_step_ = step_seconds;
    note_a_budget_below_the_fewest_steps(list.size() + 1);  // and the combination
    for (size_t i = 0; i < list.size() && !stopped(); ++i) {
      size_blocks(list.size() - i + 1);  // and the combination's
      result_.trials.push_back(measure(list[i]));
      log(result_.trials.back());
    }
    size_blocks(1);
    recommend();
    result_.baseline_peak_tensor_mb = baseline_peak_mb_;
    // The user's own options (outputs, progress) with what tune changed.
    result_.recommended = with(user_, differences(base_, result_.recommended));
    result_.baseline = user_;
    return std::move(result_);
  }

 private:
  // Steps per measurement, so that the trials left fit what is left of the budget's trial share
  // at the seconds per step the trials so far took (slower settings, sessions' start included).
  void size_blocks(size_t trials_left) {
    const double left = std::max(0.0, kTrialShare * options_.time_budget() - elapsed());
    const double measurements = double(trials_left * 2 * options_.rounds());
    steps_ = std::clamp<int64_t>(int64_t(left / (measurements * seconds_per_step_)) - kWarmupSteps, kFewestSteps, 2000);
  }

  // A budget too small for every trial's fewest steps is said once, not silently overrun.
  void note_a_budget_below_the_fewest_steps(size_t trials) {
    const int64_t fewest_steps = kSessionWarmupSteps + 2 * options_.rounds() * (kWarmupSteps + kFewestSteps);
    const double fewest_seconds = double(trials) * double(fewest_steps) * seconds_per_step_;
    if (fewest_seconds <= kTrialShare * options_.time_budget()) return;
    note(fmt::format("the {} trials need about {:.0f} s at their fewest steps ({} each), more than --time-budget {:g} s "
                     "leaves them: each runs its fewest",
                     trials, fewest_seconds, fewest_steps, options_.time_budget()));
  }

  void note(const std::string& line) {
    result_.notes.push_back(line);
    if (options_.log()) options_.log()(line);
  }

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  bool stopped() {
    if (options_.stop() && options_.stop()->load()) result_.interrupted = true;
    return result_.interrupted;
  }

  void log(const Trial& trial) const {
    if (options_.log()) {
      options_.log()(fmt::format("{} {}: {:.2f}x ({})", trial.technique, trial.setting, trial.speedup.median, trial.verdict));
    }
  }

  // Batch sizes from a quarter to 4x the user's, smallest first: measure() skips one whose peak
  // tensor memory, extrapolated linearly from the two largest measured, exceeds the budget.
  void add_batch_sizes(std::vector<Candidate>& list) {
    for (int64_t factor : {-4, -2, 2, 4}) {
      int64_t batch = factor < 0 ? base_.batch_size / -factor : base_.batch_size * factor;
      if (batch >= 8) batch_sizes_.push_back(batch);
    }
    for (int64_t batch : batch_sizes_) list.push_back({"batch size", {{"batch_size", std::to_string(batch)}}, true});
  }

  bool predicted_over_budget(int64_t batch) const {
    if (options_.memory_budget_mb() <= 0) return false;
    std::vector<std::pair<double, double>> points{{double(base_.batch_size), baseline_peak_mb_}};
    for (const auto& trial : result_.trials) {
      if (trial.technique == "batch size" && trial.peak_tensor_mb > 0) {
        points.push_back({double(trial.config.batch_size), trial.peak_tensor_mb});
      }
    }
    std::sort(points.begin(), points.end());
    if (points.size() < 2) return double(batch) / points[0].first * points[0].second > options_.memory_budget_mb();
    const auto& [x0, y0] = points[points.size() - 2];
    const auto& [x1, y1] = points.back();
    const double slope = (y1 - y0) / (x1 - x0);
    return y1 + slope * (double(batch) - x1) > options_.memory_budget_mb();
  }

  // Alternating pairs: the baseline, then the candidate, `rounds` times.
  Trial measure(const Candidate& candidate) {
    const auto trial_start = std::chrono::steady_clock::now();
    int64_t steps_run = 0;
    Trial trial;
    trial.technique = candidate.technique;
    trial.setting = describe(candidate.changes);
    trial.config = with(base_, candidate.changes);
    trial.changes_numerics = candidate.changes_numerics;
    if (trial.technique == "batch size" && predicted_over_budget(trial.config.batch_size)) {
      trial.verdict = fmt::format("not tried: predicted above the {:.0f} MB budget", options_.memory_budget_mb());
      return trial;
    }
    TrainingSession session(trial.config, data_);
    session.measure_steps(kSessionWarmupSteps, 0);
    std::vector<double> ours, theirs, ratios;
    for (int64_t round = 0; round < options_.rounds() && !stopped(); ++round) {
      auto base = baseline_->measure_steps(kWarmupSteps, steps_);
      baseline_peak_mb_ = std::max(baseline_peak_mb_, base.peak_tensor_mb);
      // As many samples as the baseline's measurement.
      auto mine = session.measure_steps(kWarmupSteps, std::max<int64_t>(1, steps_ * base_.batch_size * base_.accumulate /
                                                                          (trial.config.batch_size * trial.config.accumulate)));
      if (mine.diverged) {  // (sketched layers at the recipe's learning rate, say)
        trial.verdict = fmt::format("diverged: a loss turned inf or NaN at lr {:g}", trial.config.lr);
        return trial;
      }
      theirs.push_back(base.samples_per_sec);
      ours.push_back(mine.samples_per_sec);
      ratios.push_back(ours.back() / theirs.back());
      trial.peak_tensor_mb = std::max(trial.peak_tensor_mb, mine.peak_tensor_mb);
      steps_run += 2 * (kWarmupSteps + steps_);
    }
    if (steps_run > 0) {
      seconds_per_step_ =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - trial_start).count() / double(steps_run);
    }
    if (ratios.empty()) {
      trial.verdict = "interrupted";
      return trial;
    }
    trial.samples_per_sec = spread(ours);
    trial.baseline_samples_per_sec = spread(theirs);
    trial.speedup = spread(ratios);
    trial.verdict = verdict(trial.speedup);
    return trial;
  }

  // The measurably faster settings combine, fastest first, each unless it sets a field an earlier
  // one set (one setting per technique; accumulation's batch size against a batch-size trial's),
  // and the combination is measured against the baseline. The recommendation is the first of the
  // combination (when at least as fast as the best single setting) and the faster single
  // settings, fastest first, whose accuracy holds if it changes numerics.
  void recommend() {
    std::vector<const Trial*> faster;
    for (const auto& trial : result_.trials) {
      if (trial.verdict == "faster") faster.push_back(&trial);
    }
    if (faster.empty() || result_.interrupted) {
      result_.kept_because =
          faster.empty() ? "no setting was measurably faster" : "interrupted before a recommendation was measured";
      return;
    }
    std::stable_sort(faster.begin(), faster.end(),
                     [](const Trial* a, const Trial* b) { return a->speedup.median > b->speedup.median; });
    const Trial& best = *faster.front();
    Candidate together{kAllFasterTogether, {}, false};
    std::set<std::string> fields_set;
    for (const Trial* trial : faster) {
      Changes changes = differences(base_, trial->config);
      bool overlaps = std::any_of(changes.begin(), changes.end(), [&](const auto& c) { return fields_set.count(c.first); });
      if (overlaps) continue;
      for (const auto& change : changes) fields_set.insert(change.first);
      together.changes.insert(together.changes.end(), changes.begin(), changes.end());
      together.changes_numerics |= trial->changes_numerics;
    }
    result_.best_single = best.technique + ": " + best.setting;
    result_.best_single_speedup = best.speedup.median;
    result_.final_comparison = measure(together);
    // The fastest first; one that changes numerics only if its accuracy holds.
    std::vector<const Trial*> choices(faster.begin(), faster.end());
    if (result_.final_comparison.speedup.median >= best.speedup.median) {
      choices.insert(choices.begin(), &result_.final_comparison);
    }
    for (const Trial* choice : choices) {
      if (stopped()) {
        result_.kept_because = "interrupted during the accuracy checks";
        return;
      }
      if (!choice->changes_numerics || accuracy_holds(*choice)) {
        result_.recommended = choice->config;
        result_.recommended_trial = *choice;
        return;
      }
    }
    result_.kept_because = result_.accuracy_checks.empty()
                               ? "every faster setting changes numerics, and none was checked for accuracy"
                               : "every faster setting changes numerics, and none passed an accuracy check";
  }

  // One epoch on a 10% validation split against the baseline in fp32 (trained once), unless
  // that would overrun the budget: then the setting is not recommended, and the note says why.
  bool accuracy_holds(const Trial& trial) {
    if (!options_.check_accuracy()) return false;
    const std::string setting = trial.technique == kAllFasterTogether ? "the faster settings together" : trial.setting;
    const bool with_reference = !validation_data_;  // the fp32 reference trains at the first check
    const double check_seconds =
        (with_reference ? 2 : 1) * (1 - kValidationSplit) * double(data_.train->size()) * sample_seconds_;
    if (elapsed() + check_seconds > options_.time_budget()) {
      note(fmt::format("accuracy check of {}: not run, an epoch of training {} takes about {:.0f} s, beyond "
                       "--time-budget {:g} s; a setting that changes numerics is recommended only after its check",
                       setting, with_reference ? "for it and one for the fp32 reference" : "for it", check_seconds,
                       options_.time_budget()));
      return false;
    }
    auto validated = [](TrainConfig config) {
      config.validation_split = kValidationSplit;
      config.epochs = 1;
      return config;
    };
    if (!validation_data_) {
      TrainConfig reference = validated(base_);
      reference.precision = "fp32";
      validation_data_ = std::make_unique<train::TrainingData>(train::load_training_data(reference));
      fp32_accuracy_ = TrainingSession(reference, *validation_data_).fit().test_accuracy;
    }
    AccuracyCheck check;
    check.setting = setting;
    check.fp32_accuracy = fp32_accuracy_;
    check.accuracy = TrainingSession(validated(trial.config), *validation_data_).fit().test_accuracy;
    check.passed = check.accuracy >= check.fp32_accuracy - kAccuracyTolerance;
    result_.accuracy_checks.push_back(check);
    if (options_.log()) {
      options_.log()(fmt::format("accuracy of {}: {:.4f} against fp32's {:.4f}", check.setting, check.accuracy, check.fp32_accuracy));
    }
    return check.passed;
  }

  TuneOptions options_;
  std::chrono::steady_clock::time_point start_;
  TrainConfig user_;
  TrainConfig base_;
  train::TrainingData data_;
  std::unique_ptr<train::TrainingData> validation_data_;  // for accuracy checks, loaded on the first
  double fp32_accuracy_ = 0;
  std::unique_ptr<TrainingSession> baseline_;
  std::vector<int64_t> batch_sizes_;
  double baseline_peak_mb_ = 0;
  int64_t steps_ = 0;              // timed steps per measurement
  double seconds_per_step_ = 0;    // of the last trial, everything included
  double sample_seconds_ = 0;      // of the baseline's training steps
  TuneResult result_;
};

}  // namespace

void validate(const TuneOptions& options) {
  if (!(options.time_budget() > 0) || !std::isfinite(options.time_budget())) {
    throw UsageError("--time-budget",
                     fmt::format("must be a positive number of seconds, got {}", options.time_budget()));
  }
  if (!(options.memory_budget_mb() >= 0) || !std::isfinite(options.memory_budget_mb())) {
    throw UsageError("--memory-budget",
                     fmt::format("must be a number of MB, 0 for any, got {}", options.memory_budget_mb()));
  }
  if (options.rounds() < 1) throw UsageError("--rounds", fmt::format("must be at least 1, got {}", options.rounds()));
}

TuneResult tune_throughput(const train::TrainConfig& base, const TuneOptions& options) {
  validate(options);
  return Tuner(base, options).run();
}

}  // namespace afterburner::tune
