// tune's outputs: the terminal table, tune.json, recommended.toml and report.md with its plots.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "afterburner/core/file_writer.h"
#include "afterburner/tune/tune.h"
#include "svg.h"

namespace afterburner::tune {
namespace {

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
  if (t.samples_per_sec.median <= 0) return fmt::format("{:<22} {:<34} {}\n", t.technique, t.setting, t.verdict);
  return fmt::format("{:<22} {:<34} {:>7.0f} [{:>6.0f}-{:>6.0f}] {:>6.2f}x [{:.2f}-{:.2f}] {:>8.0f}  {}{}\n", t.technique,
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

std::string markdown(const TuneResult& r) {
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
  if (!r.best_single.empty()) {
    md += fmt::format("Best single setting: {} ({:.2f}x); all faster settings together: {:.2f}x.\n\n", r.best_single,
                      r.best_single_speedup, r.final_comparison.speedup.median);
  }
  const auto changes = train::to_toml(r.recommended, &r.baseline);
  md += changes.empty() ? std::string("Recommended: the configuration as given; nothing faster passed the checks.\n\n")
                        : "Recommended, changing the configuration given by:\n\n```toml\n" + changes +
                              "```\n\nThe whole configuration is recommended.toml, for `afterburner train --config`.\n\n";
  for (const auto& check : r.accuracy_checks) {
    md += fmt::format("Accuracy check of {}: validation accuracy {:.4f} after one epoch against fp32's {:.4f}: {}.\n\n",
                      check.setting, check.accuracy, check.fp32_accuracy,
                      check.passed ? "within 0.5 points" : "more than 0.5 points lower, not recommended");
  }
  for (const auto& note : r.notes) md += "- " + note + "\n";
  md += "\n![speedups](speedups.svg)\n\n![throughput against batch size](batch-size.svg)\n\n"
        "![memory against batch size](memory.svg)\n\n![throughput against loader workers](workers.svg)\n";
  return md;
}

}  // namespace

nlohmann::json TuneResult::to_json() const {
  nlohmann::json trials_json = nlohmann::json::array();
  for (const auto& t : trials) trials_json.push_back(trial_json(t));
  nlohmann::json j{{"objective", "throughput"},
                   {"baseline", train::to_toml(baseline)},
                   {"recommended", train::to_toml(recommended)},
                   {"trials", trials_json},
                   {"recommended_vs_baseline", trial_json(final_comparison)},
                   {"best_single", best_single},
                   {"best_single_speedup", best_single_speedup},
                   {"notes", notes},
                   {"interrupted", interrupted},
                   {"accuracy_checks", nlohmann::json::array()}};
  for (const auto& check : accuracy_checks) {
    j["accuracy_checks"].push_back({{"setting", check.setting}, {"accuracy", check.accuracy},
                                    {"fp32_accuracy", check.fp32_accuracy}, {"passed", check.passed}});
  }
  return j;
}

std::string format_table(const TuneResult& r) {
  std::string text = fmt::format("{:<22} {:<34} {:>23} {:>19} {:>8}  {}\n", "technique", "setting",
                                 "samples/s [min-max]", "speedup [min-max]", "peak MB", "verdict");
  for (const auto& t : r.trials) text += table_row(t);
  if (r.final_comparison.samples_per_sec.median > 0) text += table_row(r.final_comparison);
  for (const auto& note : r.notes) text += "note: " + note + "\n";
  return text;
}

void write_report(const TuneResult& r, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const train::TrainConfig defaults;
  auto path = [&](const char* name) { return (fs::path(dir) / name).string(); };
  write_file_atomically(path("tune.json"), r.to_json().dump(2) + "\n");
  write_file_atomically(path("recommended.toml"), "# afterburner tune's recommendation: afterburner train --config " +
                                                      path("recommended.toml") + "\n" + train::to_toml(r.recommended, &defaults));
  std::vector<svg::Bar> bars;
  for (const auto& t : r.trials) {
    if (t.samples_per_sec.median > 0) bars.push_back({t.technique + ": " + t.setting, t.speedup.median, t.speedup.min, t.speedup.max});
  }
  if (r.final_comparison.samples_per_sec.median > 0) {
    const auto& f = r.final_comparison;
    bars.push_back({"recommended", f.speedup.median, f.speedup.min, f.speedup.max});
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
  write_file_atomically(path("report.md"), markdown(r));
}

}  // namespace afterburner::tune
