// tune's outputs agree on the recommendation: the table's rows, the line after it, tune.json and
// recommended.toml, whether tune recommends a setting or keeps the options given.
#include <gtest/gtest.h>

#include "afterburner/train/config.h"
#include "afterburner/tune/tune.h"
#include "testing.h"

namespace afterburner::tune {
namespace {

Trial faster_trial(const std::string& technique, const std::string& setting, const train::TrainConfig& config,
                   bool changes_numerics) {
  Trial trial;
  trial.technique = technique;
  trial.setting = setting;
  trial.config = config;
  trial.samples_per_sec = {1060, 1050, 1070};
  trial.baseline_samples_per_sec = {1000, 990, 1010};
  trial.speedup = {1.06, 1.04, 1.08};
  trial.changes_numerics = changes_numerics;
  trial.verdict = "faster";
  return trial;
}

// Every option at its default, and a faster bf16 that no accuracy check cleared.
TuneResult kept_defaults() {
  TuneResult result;
  train::TrainConfig bf16;
  bf16.precision = "bf16";
  result.trials.push_back(faster_trial("precision", "precision=bf16", bf16, true));
  result.final_comparison = faster_trial(kAllFasterTogether, "precision=bf16", bf16, true);
  result.kept_because = "every faster setting changes numerics, and none was checked for accuracy";
  return result;
}

TEST(TuneReport, KeepingTheOptionsGivenIsSaidEverywhereAndNoRowClaimsARecommendation) {
  const TuneResult result = kept_defaults();
  const std::string table = format_table(result);
  EXPECT_EQ(table.find("\nrecommended"), std::string::npos) << table;
  EXPECT_NE(table.find("\nall faster together "), std::string::npos) << table;
  EXPECT_EQ(format_recommendation(result, "tune/"),
            "recommended: the options given, unchanged: every faster setting changes numerics, and none was checked "
            "for accuracy\ntune/recommended.toml, for afterburner train --config:\n(every option at its default)\n");

  testing::TempDir dir;
  write_report(result, (dir / "tune/").string());
  const std::string toml = testing::read_file(dir / "tune" / "recommended.toml");
  EXPECT_EQ(toml, "# afterburner tune recommends the options given, unchanged: every faster setting changes numerics, "
                  "and none was checked for accuracy\n# afterburner train --config " +
                      (dir / "tune" / "recommended.toml").string() +
                      "\n# every option at its default: nothing to set\n");
  const auto json = result.to_json();
  EXPECT_TRUE(json.at("recommended_vs_baseline").is_null()) << json.dump(2);
  EXPECT_EQ(json.at("all_faster_together").at("technique"), kAllFasterTogether);
  EXPECT_EQ(json.at("recommendation").get<std::string>().rfind("the options given, unchanged: ", 0), 0u);
  EXPECT_NE(testing::read_file(dir / "tune" / "report.md").find("Recommended: the options given, unchanged"),
            std::string::npos);
}

TEST(TuneReport, ARecommendedSettingIsNamedWithItsSpeedup) {
  TuneResult result = kept_defaults();
  train::TrainConfig unfused;
  unfused.fuse = false;
  result.trials.push_back(faster_trial("fuse", "fuse=false", unfused, false));
  result.recommended = unfused;
  result.recommended_trial = result.trials.back();
  result.kept_because.clear();
  EXPECT_EQ(recommendation(result), "fuse=false: 1.06x the samples/s of the options given");
  EXPECT_EQ(format_recommendation(result, "tune"),
            "recommended: fuse=false: 1.06x the samples/s of the options given\n"
            "tune/recommended.toml, for afterburner train --config:\nfuse = false\n");
  EXPECT_EQ(result.to_json().at("recommended_vs_baseline").at("technique"), "fuse");

  result.recommended.precision = "bf16";
  result.recommended_trial = result.final_comparison;
  EXPECT_EQ(recommendation(result),
            "precision=bf16, fuse=false (all faster settings together): 1.06x the samples/s of the options given");
}

}  // namespace
}  // namespace afterburner::tune
