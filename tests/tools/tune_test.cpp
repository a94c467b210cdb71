// afterburner tune: trials of every technique against the baseline, a recommendation that
// `train --config` accepts, and plots that open.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

// The value text of `name` in TOML as to_toml() writes it, one `name = value` per line.
std::string toml_value(const std::string& toml, const std::string& name) {
  auto line = toml.find(name + " = ");
  EXPECT_TRUE(line == 0 || (line != std::string::npos && toml[line - 1] == '\n')) << name << " in " << toml;
  if (line == std::string::npos) return "";
  auto at = line + name.size() + 3;
  return toml.substr(at, toml.find('\n', at) - at);
}

// Opens: Python's XML parser reads it, and its root is an <svg>.
::testing::AssertionResult opens_as_svg(const std::filesystem::path& path) {
  auto parsed = run({"/usr/bin/python3", "-c",
                     "import sys, xml.etree.ElementTree as ET; root = ET.parse(sys.argv[1]).getroot(); "
                     "sys.exit(0 if root.tag.endswith('svg') else 1)",
                     path.string()});
  if (parsed.exit_code == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << path << ": " << parsed.err;
}

class CliTune : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_mnist(dir_.path(), 512, 256); }

  // A short tune of mlp in fp32 on one thread; `flags` add to or replace these.
  CommandResult tune(std::map<std::string, std::string> flags = {}) {
    std::map<std::string, std::string> all{{"--data", dir_.path().string()}, {"--model", "mlp"},
                                           {"--batch-size", "32"},          {"--threads", "1"},
                                           {"--workers", "0"},              {"--precision", "fp32"},
                                           {"--time-budget", "8"},          {"--rounds", "2"},
                                           {"--report", report_dir().string()}};
    for (const auto& [flag, value] : flags) all[flag] = value;
    std::vector<std::string> args{"tune"};
    for (const auto& [flag, value] : all) {
      args.push_back(flag);
      if (!value.empty()) args.push_back(value);
    }
    return run_cli(args);
  }
  std::filesystem::path report_dir() const { return dir_ / "tune"; }

  TempDir dir_;
};

TEST_F(CliTune, MeasuresEachTechniqueAgainstTheBaselineAndRecommendsAConfigTrainAccepts) {
  auto result = tune();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(report_dir() / "tune.json");
  std::set<std::string> techniques;
  const std::set<std::string> verdicts{"faster", "slower", "no measurable gain"};
  for (const auto& trial : report.at("trials")) {
    techniques.insert(trial.at("technique").get<std::string>());
    // A setting whose loss diverges (sketched layers at lr 0.1 may) has no speed to compare.
    if (trial.at("verdict").get<std::string>().rfind("diverged: a loss turned inf or NaN at lr ", 0) == 0) continue;
    ASSERT_TRUE(verdicts.count(trial.at("verdict").get<std::string>())) << trial.dump();
    const auto& speedup = trial.at("speedup");
    EXPECT_LE(speedup.at("min").get<double>(), speedup.at("median").get<double>()) << trial.dump();
    EXPECT_LE(speedup.at("median").get<double>(), speedup.at("max").get<double>()) << trial.dump();
    EXPECT_GT(trial.at("samples_per_sec").at("min").get<double>(), 0) << trial.dump();
    // The verdict follows the pairs' range: faster only if every pair was faster.
    EXPECT_EQ(trial.at("verdict") == "faster", speedup.at("min").get<double>() > 1) << trial.dump();
    EXPECT_EQ(trial.at("verdict") == "slower", speedup.at("max").get<double>() < 1) << trial.dump();
  }
  for (const char* expected : {"precision", "fuse", "loader workers", "intra-op threads", "batch size",
                               "gradient accumulation", "activation checkpointing", "sketching"}) {
    EXPECT_TRUE(techniques.count(expected)) << expected << " in " << report.dump(2);
  }
  EXPECT_EQ(techniques.count("layout"), 0u);  // mlp has no convolutions
  // A check passes when the setting's accuracy is within 0.5 points of fp32's; what changes
  // numerics is recommended only with a passed check.
  bool passed_any = false;
  for (const auto& check : report.at("accuracy_checks")) {
    double accuracy = check.at("accuracy"), fp32 = check.at("fp32_accuracy");
    EXPECT_EQ(check.at("passed").get<bool>(), accuracy >= fp32 - 0.005) << check.dump();
    passed_any |= check.at("passed").get<bool>();
  }
  auto recommended_toml = report.at("recommended").get<std::string>();
  auto value_of = [&](const std::string& name) { return toml_value(recommended_toml, name); };
  // Accumulation at the same effective batch keeps the numerics.
  bool numerics_changed = std::stoi(value_of("batch_size")) * std::stoi(value_of("accumulate")) != 32 ||
                          value_of("precision") != "'fp32'";
  EXPECT_TRUE(!numerics_changed || passed_any) << report.dump(2);
  EXPECT_NE(result.out.find("technique"), std::string::npos) << result.out;

  // The recommendation trains as given, and the run records the same options.
  auto recommended = report_dir() / "recommended.toml";
  ASSERT_TRUE(std::filesystem::exists(recommended));
  auto run = run_cli({"train", "--config", recommended.string(), "--data", dir_.path().string(), "--model", "mlp",
                      "--max-steps", "2", "--progress", "none", "--report", (dir_ / "run.json").string()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto printed = run_cli({"train", "--config", recommended.string(), "--print-config"});
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  auto config = read_json(dir_ / "run.json").at("config");
  std::istringstream lines(printed.out);
  for (std::string line; std::getline(lines, line);) {
    auto name = line.substr(0, line.find(" = "));
    if (name == "data" || name == "model" || name == "max_steps" || name == "progress" || name == "report") continue;
    auto value = line.substr(line.find(" = ") + 3);
    if (value.front() == '\'') value = value.substr(1, value.size() - 2);
    EXPECT_EQ(config.at(name).get<std::string>(), value) << name;
  }
}

TEST_F(CliTune, PlotsAreWellFormedSvgWithLabelledAxes) {
  auto result = tune();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto markdown = read_file(report_dir() / "report.md");
  for (const char* plot : {"speedups.svg", "batch-size.svg", "memory.svg", "workers.svg"}) {
    auto path = report_dir() / plot;
    ASSERT_TRUE(std::filesystem::exists(path)) << plot;
    EXPECT_NE(markdown.find(plot), std::string::npos) << plot;
    EXPECT_TRUE(opens_as_svg(path));
  }
  // Axes carry their units.
  EXPECT_NE(read_file(report_dir() / "batch-size.svg").find("batch size (samples)"), std::string::npos);
  EXPECT_NE(read_file(report_dir() / "memory.svg").find("(MiB)"), std::string::npos);
  EXPECT_NE(read_file(report_dir() / "speedups.svg").find("speedup (samples/s over the baseline"), std::string::npos);
}

TEST_F(CliTune, BatchSizesPredictedAboveTheMemoryBudgetAreNotTried) {
  auto result = tune({{"--memory-budget", "0.001"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(report_dir() / "tune.json");
  int batch_trials = 0;
  for (const auto& trial : report.at("trials")) {
    if (trial.at("technique") != "batch size") continue;
    ++batch_trials;
    EXPECT_EQ(trial.at("verdict").get<std::string>().rfind("not tried: predicted above", 0), 0u) << trial.dump();
  }
  EXPECT_GT(batch_trials, 0);
}

// The trials shrink to their fewest steps and say so; no accuracy check fits, so nothing that
// changes numerics is recommended, whatever the trials measured, and no output says otherwise.
TEST_F(CliTune, ABudgetTooSmallIsNotedAndRecommendsNothingUnchecked) {
  auto result = tune({{"--time-budget", "0.01"}, {"--report", report_dir().string() + "/"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // The faster settings together are measured, but only a recommendation is called one.
  EXPECT_EQ(result.out.find("\nrecommended "), std::string::npos) << result.out;
  const auto recommended_line = result.out.find("\nrecommended: ");
  ASSERT_NE(recommended_line, std::string::npos) << result.out;
  auto report = read_json(report_dir() / "tune.json");
  const auto recommendation = report.at("recommendation").get<std::string>();
  EXPECT_EQ(result.out.find("recommended: " + recommendation + "\n"), recommended_line + 1) << result.out;
  const auto toml_file = report_dir() / "recommended.toml";  // the path joined: no "tune//"
  EXPECT_EQ(read_file(toml_file).rfind("# afterburner tune recommends " + recommendation + "\n", 0), 0u);
  EXPECT_NE(result.out.find(toml_file.string() + ", for afterburner train --config:\n", recommended_line),
            std::string::npos)
      << result.out;
  const auto notes = report.at("notes").dump();
  EXPECT_NE(notes.find("at their fewest steps"), std::string::npos) << notes;
  EXPECT_TRUE(report.at("accuracy_checks").empty()) << report.at("accuracy_checks").dump();
  const auto recommended = report.at("recommended").get<std::string>();
  EXPECT_EQ(std::stoi(toml_value(recommended, "batch_size")) * std::stoi(toml_value(recommended, "accumulate")), 32)
      << recommended;
  EXPECT_EQ(toml_value(recommended, "precision"), "'fp32'") << recommended;
}

// Each trial changes one setting of the best recipe so far and is adopted only when it beats it:
// in fewer samples to the target, or in more than 5% less time (when it changes a sample's cost).
TEST_F(CliTune, TimeToAccuracySearchesTheRecipeOnAValidationSplitAndMeasuresItOnTheTestSet) {
  auto result = tune({{"--objective", "time-to-accuracy"}, {"--target-accuracy", "0.95"}, {"--lr-find", ""},
                      {"--time-budget", "60"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(report_dir() / "tune.json");
  EXPECT_EQ(report.at("objective"), "time-to-accuracy");
  const auto& trials = report.at("recipe_trials");
  ASSERT_GT(trials.size(), 3u) << report.dump(2);
  ASSERT_EQ(trials[0].at("change"), "baseline");
  ASSERT_FALSE(trials[0].at("seconds_to_target").is_null()) << "the synthetic set reaches 95%: " << trials[0].dump();
  nlohmann::json best = trials[0];
  for (const auto& trial : trials) {
    EXPECT_EQ(trial.at("evaluated_on"), "validation") << "the search never sees the test set";
    if (trial.at("change") == "baseline" || trial.at("seconds_to_target").is_null()) continue;
    const bool fewer_samples = trial.at("samples_to_target") < best.at("samples_to_target");
    const bool faster = trial.at("seconds_to_target").get<double>() < 0.95 * best.at("seconds_to_target").get<double>();
    if (trial.at("verdict") == "adopted") {
      EXPECT_TRUE(fewer_samples || faster) << trial.dump() << " over " << best.dump();
      best = trial;
    } else {
      EXPECT_FALSE(fewer_samples && faster) << trial.dump() << " over " << best.dump();
    }
  }
  // The recommendation is the best trial's recipe.
  const auto recommended = report.at("recommended").get<std::string>(), winner = best.at("config").get<std::string>();
  for (const char* field : {"lr", "epochs", "batch_size", "schedule", "nesterov", "warmup_steps", "weight_decay",
                            "augment", "precision"}) {
    EXPECT_EQ(toml_value(recommended, field), toml_value(winner, field)) << field;
  }
  const auto& on_test = report.at("on_test");
  ASSERT_GE(on_test.size(), 1u);
  EXPECT_EQ(on_test[0].at("change"), "baseline");
  for (const auto& run : on_test) EXPECT_EQ(run.at("evaluated_on"), "test");

  const auto& lr_find = report.at("lr_find");
  EXPECT_DOUBLE_EQ(lr_find.at("suggestion").get<double>(), lr_find.at("min_loss_lr").get<double>() / 10);
  auto markdown = read_file(report_dir() / "report.md");
  for (const char* plot : {"recipe.svg", "accuracy-time.svg", "lr-find.svg"}) {
    EXPECT_TRUE(opens_as_svg(report_dir() / plot));
    EXPECT_NE(markdown.find(plot), std::string::npos) << plot;
  }
  EXPECT_TRUE(Contains(read_file(report_dir() / "accuracy-time.svg"), "test accuracy (%)"));
  EXPECT_TRUE(Contains(read_file(report_dir() / "accuracy-time.svg"), "(s)"));
  EXPECT_TRUE(Contains(read_file(report_dir() / "lr-find.svg"), "learning rate (log scale)"));

  auto run = run_cli({"train", "--config", (report_dir() / "recommended.toml").string(), "--data", dir_.path().string(),
                      "--max-steps", "2", "--progress", "none"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

TEST_F(CliTune, BadOptionsAreOneLine) {
  EXPECT_TRUE(fails_with(tune({{"--objective", "time-to-accuracy"}}), 2, {"--target-accuracy"}));
  for (const char* budget : {"-3", "0", "nan", "inf"}) {  // not a 309-digit range: CLI11's, printed by std::to_string
    EXPECT_TRUE(fails_with(tune({{"--time-budget", budget}}), 2,
                           {"--time-budget: must be a positive number of seconds, got"}));
  }
  EXPECT_TRUE(fails_with(tune({{"--memory-budget", "-1"}}), 2, {"--memory-budget", "got -1"}));
  EXPECT_TRUE(fails_with(tune({{"--objective", "accuracy"}}), 2, {"--objective"}));
  EXPECT_TRUE(fails_with(run_cli({"tune", "--model", "mlp"}), 2, {"--report"}));
  EXPECT_TRUE(fails_with(tune({{"--data", (dir_ / "nowhere").string()}}), 1, {"nowhere"}));
}

}  // namespace
}  // namespace afterburner::testing
