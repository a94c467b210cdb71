// tune's outputs: the terminal table, tune.json, recommended.toml and report.md with its plots.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "afterburner/core/file_writer.h"
#include "afterburner/tune/tune.h"
#include "changes.h"
#include "svg.h"

namespace afterburner::tune {
namespace {

std::string recommendation_markdown(const TuneResult& r) {
  const auto changes = train::to_toml(r.recommended, &r.baseline);
  return "Recommended: " + recommendation(r) + ".\n\n" +
         (changes.empty() ? "" : "Against the configuration given:\n\n```toml\n" + changes +
                                     "```\n\nThe whole configuration is recommended.toml, for `afterburner train "
                                     "--config`.\n\n");
}

// The recommended options that differ from the defaults, as TOML: what recommended.toml sets.
std::string options_set(const TuneResult& r) {
  const train::TrainConfig defaults;
  return train::to_toml(r.recommended, &defaults);
}

std::string report_file(const std::string& dir, const char* name) {
  return (std::filesystem::path(dir) / name).string();
}

std::string recommended_toml(const TuneResult& r, const std::string& path) {
  const auto options = options_set(r);
  return fmt::format("# afterburner tune recommends {}\n# afterburner train --config {}\n{}", recommendation(r), path,
                     options.empty() ? "# every option at its default: nothing to set\n" : options);
}

std::string lr_find_markdown(const TuneResult& r) {
  if (!r.lr_find) return "";
  const auto& f = *r.lr_find;
  return fmt::format("\n## Learning-rate range test\n\nOne step at each learning rate from {:.3g} up, from fresh "
                     "weights, the loss smoothed by a moving average; {}. The smoothed loss is lowest at lr {:.3g}; "
                     "suggested: a tenth of that, {:.3g}.\n\n![loss against learning rate](lr-find.svg)\n",
                     f.lrs.empty() ? 0.0 : f.lrs.front(), f.stop_reason, f.min_loss_lr, f.suggestion);
}

nlohmann::json spread_json(const Spread& s) { return {{"median", s.median}, {"min", s.min}, {"max", s.max}}; }

nlohmann::json trial_json(const Trial& t) {
  return {{"technique", t.technique},
          {"setting", t.setting},
          {"samples_per_sec", spread_json(t.samples_per_sec)},
          {"baseline_samples_per_sec", spread_json(t.baseline_samples_per_sec)},
          {"speedup", spread_json(t.speedup)},
          {"peak_tensor_mb", t.peak_tensor_mb},
          {"changes_numerics", t.changes_numerics},
          {"verdict", t.verdict}};
}

std::string table_row(const Trial& t) {
  if (t.samples_per_sec.median <= 0) return fmt::format("{:<24} {:<34} {}\n", t.technique, t.setting, t.verdict);
  return fmt::format("{:<24} {:<34} {:>7.0f} [{:>6.0f}-{:>6.0f}] {:>6.2f}x [{:.2f}-{:.2f}] {:>8.0f}  {}{}\n", t.technique,
                     t.setting, t.samples_per_sec.median, t.samples_per_sec.min, t.samples_per_sec.max,
                     t.speedup.median, t.speedup.min, t.speedup.max, t.peak_tensor_mb, t.verdict,
                     t.changes_numerics ? " (changes numerics)" : "");
}

// Samples/s (or peak memory) against one numeric field of the trials of `technique`, with the
// baseline's point: its median over those trials' pairs.
std::vector<svg::Point> curve(const TuneResult& r, const std::string& technique, int64_t train::TrainConfig::*field,
                              bool memory) {
  std::vector<svg::Point> points;
  std::vector<double> baseline;
  for (const auto& t : r.trials) {
    if (t.technique != technique || t.samples_per_sec.median <= 0) continue;
    points.push_back({double(t.config.*field), memory ? t.peak_tensor_mb : t.samples_per_sec.median});
    baseline.push_back(t.baseline_samples_per_sec.median);
  }
  if (points.empty() || r.baseline.*field < 0) return points;  // e.g. workers = auto
  std::sort(baseline.begin(), baseline.end());
  points.push_back({double(r.baseline.*field), memory ? r.baseline_peak_tensor_mb : baseline[baseline.size() / 2]});
  std::sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.x < b.x; });
  return points;
}

std::string throughput_markdown(const TuneResult& r) {
  std::string md = "# afterburner tune: throughput\n\n";
  md += fmt::format("Baseline: the options given (`afterburner train` defaults otherwise); model `{}`, batch {}, precision "
                    "{}.\nEvery trial alternates the baseline and the setting in pairs; speedups are pair by pair, "
                    "median [min-max]. A range that straddles 1 is reported as no measurable gain.\n\n",
                    r.baseline.model, r.baseline.batch_size, r.baseline.precision);
  md += "| technique | setting | samples/s median [min-max] | speedup [min-max] | peak tensor MB | verdict |\n";
  md += "| --- | --- | --- | --- | --- | --- |\n";
  auto row = [](const Trial& t) {
    return fmt::format("| {} | {} | {:.0f} [{:.0f}-{:.0f}] | {:.2f}x [{:.2f}-{:.2f}] | {:.0f} | {}{} |\n", t.technique,
                       t.setting, t.samples_per_sec.median, t.samples_per_sec.min, t.samples_per_sec.max, t.speedup.median,
                       t.speedup.min, t.speedup.max, t.peak_tensor_mb, t.verdict,
                       t.changes_numerics ? " (changes numerics)" : "");
  };
  for (const auto& t : r.trials) md += row(t);
  if (r.final_comparison.samples_per_sec.median > 0) md += row(r.final_comparison);
  md += "\n## Recommendation\n\n";
  md += recommendation_markdown(r);
  if (!r.best_single.empty()) {
    md += fmt::format("Best single setting: {} ({:.2f}x); all faster settings together: {:.2f}x.\n\n", r.best_single,
                      r.best_single_speedup, r.final_comparison.speedup.median);
  }
  for (const auto& check : r.accuracy_checks) {
    md += fmt::format("Accuracy check of {}: validation accuracy {:.4f} after one epoch against fp32's {:.4f}: {}.\n\n",
                      check.setting, check.accuracy, check.fp32_accuracy,
                      check.passed ? "within 0.5 points" : "more than 0.5 points lower, not recommended");
  }
  for (const auto& note : r.notes) md += "- " + note + "\n";
  md += "\n![speedups](speedups.svg)\n\n![throughput against batch size](batch-size.svg)\n\n"
        "![memory against batch size](memory.svg)\n\n![throughput against loader workers](workers.svg)\n";
  return md + lr_find_markdown(r);
}

std::string seconds_text(const std::optional<double>& seconds) {
  return seconds ? fmt::format("{:.1f}", *seconds) : std::string("-");
}

std::string recipe_row(const RecipeTrial& t) {
  return fmt::format("| {} | {} | {} | {:.4f} | {} |\n", t.change, seconds_text(t.seconds_to_target),
                     t.samples_to_target ? std::to_string(*t.samples_to_target) : "-", t.best_accuracy, t.verdict);
}

std::string recipe_markdown(const TuneResult& r) {
  const auto& first = r.recipe_trials.front().config;
  std::string md = "# afterburner tune: time to accuracy\n\n";
  md += fmt::format("Target: {:.4g} accuracy on the {:.0f}% of the training set held out for validation; the search "
                    "never sees the test set. Each trial changes one setting of the best recipe so far and trains "
                    "until it reaches the target or can no longer win. A change that alters the cost of a sample (batch "
                    "size, precision, augmentation) must reach the target in more than {:.0f}% less training time "
                    "(evaluation excluded), this machine's noise between single runs; any other must reach it in "
                    "fewer samples, a count free of timing noise. Single runs, seed {}.\n\n",
                    first.target_accuracy, 100 * first.validation_split, 100 * kRecipeNoise, first.seed);
  md += "| change | seconds to target | samples to target | best validation accuracy | verdict |\n| --- | --- | --- | --- | --- |\n";
  for (const auto& t : r.recipe_trials) md += recipe_row(t);
  if (!r.on_test.empty()) {
    md += "\n## On the test set\n\nThe baseline and the recommended recipe, each trained once to the target on the "
          "whole training set and evaluated on the test set:\n\n";
    md += "| run | seconds to target | samples to target | best test accuracy | |\n| --- | --- | --- | --- | --- |\n";
    for (const auto& t : r.on_test) md += recipe_row(t);
  }
  md += "\n## Recommendation\n\n" + recommendation_markdown(r);
  for (const auto& note : r.notes) md += "- " + note + "\n";
  md += "\n![seconds to the target per trial](recipe.svg)\n\n![accuracy against training time](accuracy-time.svg)\n";
  return md + lr_find_markdown(r);
}



nlohmann::json recipe_json(const RecipeTrial& t) {
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& e : t.evaluations) {
    curve.push_back({{"step", e.step}, {"samples", e.samples}, {"train_seconds", e.train_seconds}, {"accuracy", e.accuracy}});
  }
  return {{"change", t.change},
          {"evaluated_on", t.evaluated_on},
          {"seconds_to_target", t.seconds_to_target ? nlohmann::json(*t.seconds_to_target) : nlohmann::json()},
          {"samples_to_target", t.samples_to_target ? nlohmann::json(*t.samples_to_target) : nlohmann::json()},
          {"best_accuracy", t.best_accuracy},
          {"train_seconds", t.train_seconds},
          {"verdict", t.verdict},
          {"config", train::to_toml(t.config)},
          {"evaluations", curve}};
}

nlohmann::json throughput_json(const TuneResult& r) {
  nlohmann::json trials_json = nlohmann::json::array();
  for (const auto& t : r.trials) trials_json.push_back(trial_json(t));
  nlohmann::json j{{"trials", trials_json},
                   {"all_faster_together", trial_json(r.final_comparison)},
                   {"recommended_vs_baseline",
                    r.recommended_trial ? trial_json(*r.recommended_trial) : nlohmann::json()},
                   {"best_single", r.best_single},
                   {"best_single_speedup", r.best_single_speedup},
                   {"accuracy_checks", nlohmann::json::array()}};
  for (const auto& check : r.accuracy_checks) {
    j["accuracy_checks"].push_back({{"setting", check.setting}, {"accuracy", check.accuracy},
                                    {"fp32_accuracy", check.fp32_accuracy}, {"passed", check.passed}});
  }
  return j;
}

nlohmann::json recipe_search_json(const TuneResult& r) {
  nlohmann::json j{{"recipe_trials", nlohmann::json::array()}, {"on_test", nlohmann::json::array()}};
  for (const auto& t : r.recipe_trials) j["recipe_trials"].push_back(recipe_json(t));
  for (const auto& t : r.on_test) j["on_test"].push_back(recipe_json(t));
  return j;
}

std::string recipe_table(const TuneResult& r) {
  std::string text = fmt::format("{:<40} {:>10} {:>10} {:>9}  {}\n", "change", "seconds", "samples", "accuracy", "verdict");
  auto row = [](const RecipeTrial& t) {
    return fmt::format("{:<40} {:>10} {:>10} {:>9.4f}  {}\n", t.change, seconds_text(t.seconds_to_target),
                       t.samples_to_target ? std::to_string(*t.samples_to_target) : "-", t.best_accuracy, t.verdict);
  };
  for (const auto& t : r.recipe_trials) text += row(t);
  if (!r.on_test.empty()) text += "on the test set:\n";
  for (const auto& t : r.on_test) text += row(t);
  return text;
}

void write_throughput_plots(const TuneResult& r, const std::function<std::string(const char*)>& path) {
  std::vector<svg::Bar> bars;
  for (const auto& t : r.trials) {
    if (t.samples_per_sec.median > 0) bars.push_back({t.technique + ": " + t.setting, t.speedup.median, t.speedup.min, t.speedup.max});
  }
  if (r.final_comparison.samples_per_sec.median > 0) {
    const auto& f = r.final_comparison;
    bars.push_back({f.technique, f.speedup.median, f.speedup.min, f.speedup.max});
  }
  write_file_atomically(path("speedups.svg"),
                        svg::bar_chart("Training throughput against the baseline (median, whiskers min-max)",
                                       "speedup (samples/s over the baseline's, x)", bars, 1.0));
  write_file_atomically(path("batch-size.svg"),
                        svg::line_chart("Training throughput against batch size", "batch size (samples)",
                                        "training samples/s", {{"samples/s", curve(r, "batch size", &train::TrainConfig::batch_size, false)}}));
  write_file_atomically(path("memory.svg"),
                        svg::line_chart("Peak tensor memory of a training step against batch size", "batch size (samples)",
                                        "peak tensor memory (MiB)", {{"MiB", curve(r, "batch size", &train::TrainConfig::batch_size, true)}}));
  write_file_atomically(path("workers.svg"),
                        svg::line_chart("Training throughput against loader workers", "loader workers (threads)",
                                        "training samples/s", {{"samples/s", curve(r, "loader workers", &train::TrainConfig::workers, false)}}));
}

void write_recipe_plots(const TuneResult& r, const std::function<std::string(const char*)>& path) {
  std::vector<svg::Bar> bars;
  for (const auto& t : r.recipe_trials) {
    if (t.seconds_to_target) bars.push_back({t.change, *t.seconds_to_target, *t.seconds_to_target, *t.seconds_to_target});
  }
  const auto& baseline = r.recipe_trials.front().seconds_to_target;
  write_file_atomically(path("recipe.svg"),
                        svg::bar_chart("Training time to the target on the validation split, per trial (single runs)",
                                       "seconds of training to the target (s)", bars, baseline ? *baseline : 0.0));
  std::vector<svg::Series> curves;
  for (const auto& t : r.on_test) {
    svg::Series series{t.change + " (test set)", {}};
    for (const auto& e : t.evaluations) series.points.push_back({e.train_seconds, 100 * e.accuracy});
    curves.push_back(series);
  }
  write_file_atomically(path("accuracy-time.svg"),
                        svg::line_chart("Test accuracy against training time", "training time, evaluation excluded (s)",
                                        "test accuracy (%)", curves));
}

}  // namespace

nlohmann::json TuneResult::to_json() const {
  nlohmann::json j = objective == "throughput" ? throughput_json(*this) : recipe_search_json(*this);
  j["objective"] = objective;
  j["baseline"] = train::to_toml(baseline);
  j["recommended"] = train::to_toml(recommended);
  j["recommendation"] = recommendation(*this);
  j["notes"] = notes;
  j["interrupted"] = interrupted;
  if (lr_find) j["lr_find"] = lr_find->to_json();
  return j;
}

std::string format_table(const TuneResult& r) {
  std::string text;
  if (r.lr_find) {
    text += fmt::format("learning-rate range test: lowest smoothed loss at lr {:.3g}, suggested lr {:.3g} ({})\n\n",
                        r.lr_find->min_loss_lr, r.lr_find->suggestion, r.lr_find->stop_reason);
  }
  if (r.objective == "throughput") {
    text += fmt::format("{:<24} {:<34} {:>23} {:>19} {:>8}  {}\n", "technique", "setting", "samples/s [min-max]",
                        "speedup [min-max]", "peak MB", "verdict");
    for (const auto& t : r.trials) text += table_row(t);
    if (r.final_comparison.samples_per_sec.median > 0) text += table_row(r.final_comparison);
  } else {
    text += recipe_table(r);
  }
  for (const auto& note : r.notes) text += "note: " + note + "\n";
  return text;
}

std::string recommendation(const TuneResult& r) {
  const Changes changes = differences(r.baseline, r.recommended);
  if (changes.empty()) {
    return "the options given, unchanged" + (r.kept_because.empty() ? "" : ": " + r.kept_because);
  }
  if (!r.recommended_trial) return describe(changes);
  const Trial& trial = *r.recommended_trial;
  return fmt::format("{}{}: {:.2f}x the samples/s of the options given", describe(changes),
                     trial.technique == kAllFasterTogether ? " (all faster settings together)" : "",
                     trial.speedup.median);
}

std::string format_recommendation(const TuneResult& r, const std::string& dir) {
  const auto options = options_set(r);
  return fmt::format("recommended: {}\n{}, for afterburner train --config:\n{}", recommendation(r),
                     report_file(dir, "recommended.toml"),
                     options.empty() ? "(every option at its default)\n" : options);
}

void write_report(const TuneResult& r, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  auto path = [&](const char* name) { return report_file(dir, name); };
  write_file_atomically(path("tune.json"), r.to_json().dump(2) + "\n");
  write_file_atomically(path("recommended.toml"), recommended_toml(r, path("recommended.toml")));
  if (r.lr_find) {
    svg::Series raw{"loss", {}}, smoothed{"smoothed loss", {}};
    for (size_t i = 0; i < r.lr_find->lrs.size(); ++i) {
      raw.points.push_back({r.lr_find->lrs[i], r.lr_find->losses[i]});
      smoothed.points.push_back({r.lr_find->lrs[i], r.lr_find->smoothed[i]});
    }
    write_file_atomically(path("lr-find.svg"),
                          svg::line_chart("Learning-rate range test: training loss, one step per learning rate",
                                          "learning rate (log scale)", "training loss (cross-entropy)", {raw, smoothed},
                                          svg::Axis::log));
  }
  if (r.objective == "throughput") {
    write_throughput_plots(r, path);
    write_file_atomically(path("report.md"), throughput_markdown(r));
  } else {
    write_recipe_plots(r, path);
    write_file_atomically(path("report.md"), recipe_markdown(r));
  }
}

}  // namespace afterburner::tune
