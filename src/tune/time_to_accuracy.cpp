// tune --objective time-to-accuracy: a coordinate search over the recipe, each trial trained to
// the target on a validation split; the best recipe and the baseline are then measured on the
// test set.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <set>

#include "afterburner/core/error.h"
#include "afterburner/train/callbacks.h"
#include "afterburner/train/session.h"
#include "afterburner/tune/tune.h"
#include "changes.h"

namespace afterburner::tune {
namespace {

using train::TrainConfig;

constexpr double kDefaultValidationSplit = 0.1;

std::string number(double value) { return fmt::format("{:.4g}", value); }

// One coordinate of the recipe: the settings to try around the current best.
struct Coordinate {
  std::string name;
  bool changes_sample_cost;  // batch size, precision, augmentation: judged by seconds alone
  std::function<std::vector<Changes>(const TrainConfig&)> settings;
};

std::vector<Coordinate> coordinates(const std::optional<LrFindResult>& lr_find) {
  std::vector<Coordinate> list;
  list.push_back({"learning rate", false, [lr_find](const TrainConfig& c) {
                    std::vector<Changes> s{{{"lr", number(c.lr * 2)}}, {{"lr", number(c.lr / 2)}}};
                    if (lr_find && lr_find->suggestion > 0 && std::abs(std::log(lr_find->suggestion / c.lr)) > std::log(1.25)) {
                      s.push_back({{"lr", number(lr_find->suggestion)}});
                    }
                    return s;
                  }});
  list.push_back({"schedule length", false, [](const TrainConfig& c) {
                    std::vector<Changes> s{{{"epochs", std::to_string(c.epochs + 1)}}};
                    if (c.epochs > 1) s.push_back({{"epochs", std::to_string(c.epochs - 1)}});
                    return s;
                  }});
  // With the learning rate scaled as the batch (Goyal et al., 2017).
  list.push_back({"batch size", true, [](const TrainConfig& c) {
                    std::vector<Changes> s{{{"batch_size", std::to_string(c.batch_size * 2)}, {"lr", number(c.lr * 2)}}};
                    if (c.batch_size >= 16) {
                      s.push_back({{"batch_size", std::to_string(c.batch_size / 2)}, {"lr", number(c.lr / 2)}});
                    }
                    return s;
                  }});
  list.push_back({"schedule", false, [](const TrainConfig& c) {
                    std::vector<Changes> s;
                    for (const char* kind : {"cosine", "onecycle"}) {
                      if (c.schedule != kind) s.push_back({{"schedule", kind}});
                    }
                    return s;
                  }});
  list.push_back({"nesterov", false, [](const TrainConfig& c) {
                    if (c.optimizer != "sgd" || c.momentum <= 0) return std::vector<Changes>{};
                    return std::vector<Changes>{{{"nesterov", c.nesterov ? "false" : "true"}}};
                  }});
  list.push_back({"warm-up", false, [](const TrainConfig& c) {
                    if (c.warmup_steps == 0) return std::vector<Changes>{{{"warmup_steps", "100"}}};
                    return std::vector<Changes>{{{"warmup_steps", "0"}}, {{"warmup_steps", std::to_string(c.warmup_steps * 2)}}};
                  }});
  list.push_back({"weight decay", false, [](const TrainConfig& c) {
                    if (c.weight_decay == 0) return std::vector<Changes>{{{"weight_decay", "0.0005"}}};
                    return std::vector<Changes>{{{"weight_decay", "0"}}, {{"weight_decay", number(c.weight_decay * 2)}}};
                  }});
  list.push_back({"augmentation", true, [](const TrainConfig& c) {
                    return std::vector<Changes>{{{"augment", c.augment ? "false" : "true"}}};
                  }});
  list.push_back({"precision", true, [](const TrainConfig& c) {
                    std::vector<Changes> s;
                    for (const char* precision : {"fp32", "bf16"}) {
                      if (precision != effective_precision(c) && precision_runs(precision)) s.push_back({{"precision", precision}});
                    }
                    return s;
                  }});
  return list;
}

// What a trial must beat: the best's training seconds to the target, or, when the change leaves
// the cost of a sample alone, its samples to the target (a count, free of the timing noise).
struct Threshold {
  std::optional<double> seconds;
  std::optional<int64_t> samples;
};

Threshold threshold_to_beat(const RecipeTrial& best, bool same_sample_cost) {
  if (!best.seconds_to_target) return {};
  if (same_sample_cost) return {std::nullopt, best.samples_to_target};
  return {(1 - kRecipeNoise) * *best.seconds_to_target, std::nullopt};
}

bool beats(const RecipeTrial& trial, const Threshold& threshold) {
  if (!trial.seconds_to_target) return false;
  if (threshold.samples) return *trial.samples_to_target < *threshold.samples;
  return !threshold.seconds || *trial.seconds_to_target < *threshold.seconds;
}

// Ends a trial once it can no longer beat the threshold, or on the stop flag.
class TrialLimit : public train::Callback {
 public:
  TrialLimit(Threshold threshold, StopFlag stop) : threshold_(threshold), stop_(stop) {}
  void on_step_end(const train::StepInfo& info) override {
    seconds_ += info.step_seconds;
    samples_ += info.samples;
  }
  std::string stop_reason() const override {
    if (stop_ && stop_->load()) return "interrupted";
    if (threshold_.seconds && seconds_ >= *threshold_.seconds) return fmt::format("at {:.1f} s", *threshold_.seconds);
    if (threshold_.samples && samples_ >= *threshold_.samples) return fmt::format("at {} samples", *threshold_.samples);
    return "";
  }

 private:
  Threshold threshold_;
  StopFlag stop_;
  double seconds_ = 0;
  int64_t samples_ = 0;
};

class RecipeSearch {
 public:
  RecipeSearch(const TrainConfig& user, const TuneOptions& options)
      : options_(options), start_(std::chrono::steady_clock::now()), user_(user), base_(search_base(user)) {
    if (user.target_accuracy <= 0) {
      throw UsageError("--objective time-to-accuracy", "needs --target-accuracy, e.g. --target-accuracy 0.91");
    }
  }

  TuneResult run() {
    result_.objective = "time-to-accuracy";
    result_.baseline = user_;
    result_.recommended = user_;
    validation_ = train::load_training_data(base_);
    if (options_.lr_find()) result_.lr_find = find_lr(trial_base(user_), validation_, options_.lr_find_options());
    RecipeTrial best = train_to_target("baseline", base_, validation_, Threshold{});
    best.verdict = "baseline";
    result_.recipe_trials.push_back(best);
    search(best);
    // The user's own options (outputs, progress, split) with what the search changed.
    const Changes changes = differences(base_, best.config);
    result_.recommended = with(user_, changes);
    if (changes.empty()) {
      result_.kept_because =
          result_.interrupted ? "interrupted before a change won" : "no change reached the target sooner";
    }
    measure_on_test(best.config);
    return std::move(result_);
  }

 private:
  static TrainConfig search_base(const TrainConfig& user) {
    TrainConfig config = trial_base(user);
    config.target_accuracy = user.target_accuracy;
    config.eval_every = user.eval_every;
    if (config.validation_split <= 0) config.validation_split = kDefaultValidationSplit;
    return config;
  }

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  bool stopped() {
    if (options_.stop() && options_.stop()->load()) result_.interrupted = true;
    return result_.interrupted;
  }

  // One change at a time around the best so far, adopting each that beats it; a trial is stopped
  // once it can no longer win.
  void search(RecipeTrial& best) {
    // The final runs on the test set: the baseline's and the recommendation's, each about a trial.
    const double reserve = 2.5 * wall_per_trial_;
    std::set<std::string> tried{train::to_toml(base_)};
    for (const auto& coordinate : coordinates(result_.lr_find)) {
      for (const auto& changes : coordinate.settings(best.config)) {
        TrainConfig config = with(best.config, changes);
        if (!tried.insert(train::to_toml(config)).second) continue;
        if (stopped()) return;
        if (elapsed() + wall_per_trial_ + reserve > options_.time_budget()) {
          result_.notes.push_back(fmt::format("the time budget ended the search before {}: {}", coordinate.name, describe(changes)));
          return;
        }
        const Threshold threshold = threshold_to_beat(best, !coordinate.changes_sample_cost);
        RecipeTrial trial = train_to_target(describe(changes), config, validation_, threshold);
        const bool adopted = beats(trial, threshold);
        if (trial.verdict.empty()) trial.verdict = adopted ? "adopted" : "not faster";
        result_.recipe_trials.push_back(trial);
        if (options_.log()) options_.log()(fmt::format("{}: {}", trial.change, summary(trial)));
        if (adopted) best = trial;
      }
    }
  }

  static std::string summary(const RecipeTrial& trial) {
    if (!trial.seconds_to_target) return trial.verdict;
    return fmt::format("{:.1f} s, {} samples to the target on the {} set ({})", *trial.seconds_to_target,
                       *trial.samples_to_target, trial.evaluated_on, trial.verdict);
  }

  RecipeTrial train_to_target(const std::string& change, const TrainConfig& config, const train::TrainingData& data,
                              const Threshold& threshold) {
    const auto begin = std::chrono::steady_clock::now();
    RecipeTrial trial;
    trial.change = change;
    trial.config = config;
    trial.evaluated_on = data.evaluated_on;
    train::TrainingSession session(config, data);
    session.add_callback(std::make_shared<TrialLimit>(threshold, options_.stop()));
    const auto report = session.fit();
    trial.seconds_to_target = report.train_seconds_to_target;
    trial.samples_to_target = report.samples_to_target;
    trial.train_seconds = report.train_seconds;
    trial.evaluations = report.evaluations;
    for (const auto& point : report.evaluations) trial.best_accuracy = std::max(trial.best_accuracy, point.accuracy);
    if (!trial.seconds_to_target) {
      trial.verdict = report.stop_reason == "interrupted"   ? "interrupted"
                      : report.stop_reason == "completed" ? fmt::format("not reached in {} epochs", config.epochs)
                                                          : fmt::format("not faster: stopped {}", report.stop_reason);
    }
    wall_per_trial_ = std::max(wall_per_trial_, std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    return trial;
  }

  // DAWNBench's rule: the search never saw the test set; its figures are measured there once.
  void measure_on_test(const TrainConfig& best) {
    if (stopped()) return;
    TrainConfig baseline = base_, recommended = best;
    baseline.validation_split = recommended.validation_split = 0;
    const auto test = train::load_training_data(baseline);
    result_.on_test.push_back(train_to_target("baseline", baseline, test, Threshold{}));
    result_.on_test.back().verdict = "baseline";
    if (train::to_toml(recommended) == train::to_toml(baseline) || stopped()) return;
    result_.on_test.push_back(train_to_target("recommended", recommended, test, Threshold{}));
    result_.on_test.back().verdict = "recommended";
  }

  TuneOptions options_;
  std::chrono::steady_clock::time_point start_;
  TrainConfig user_;
  TrainConfig base_;  // the user's recipe, quiet, with the target and a validation split
  train::TrainingData validation_;
  double wall_per_trial_ = 0;  // the longest trial so far, session start and evaluations included
  TuneResult result_;
};

}  // namespace

TuneResult tune_time_to_accuracy(const train::TrainConfig& base, const TuneOptions& options) {
  validate(options);
  return RecipeSearch(base, options).run();
}

}  // namespace afterburner::tune
