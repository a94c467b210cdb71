// sketch --tune's report of a search, from results made here (no timing involved): the plans'
// names in the table, and the one line of a search that found no plan.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "afterburner/tune/sketch_tune.h"
#include "testing.h"

namespace afterburner::tune {
namespace {
using afterburner::testing::Contains;

SketchPlan plan(int64_t terms, int64_t rank, int64_t features, double speedup, std::optional<double> accuracy) {
  SketchPlan p;
  p.terms = terms;
  p.rank = rank;
  p.attention_features = features;
  p.speedup = speedup;
  p.samples_per_sec = 1000 * speedup;
  p.accuracy = accuracy;
  return p;
}

SketchTuneResult searched(std::vector<SketchPlan> plans) {
  SketchTuneResult result;
  result.model = "rows.pt";
  result.target_accuracy = 0.8;
  result.batch_size = 64;
  result.dense = plan(0, 0, 0, 1, 0.85);
  result.plans = std::move(plans);
  return result;
}

TEST(SketchTuneReport, NamesEachPlansPartsInTheTable) {
  const std::string table = format_sketch_table(searched({plan(2, 32, 0, 3, 0.84), plan(1, 0, 64, 1.5, {}),
                                                          plan(1, 8, 128, 1.2, {})}));
  EXPECT_TRUE(Contains(table, "\ndense ")) << table;
  EXPECT_TRUE(Contains(table, "\nL 2 k 32 ")) << table;
  EXPECT_TRUE(Contains(table, "\nm 64 ")) << table;           // attention alone, Linear layers kept
  EXPECT_TRUE(Contains(table, "\nL 1 k 8 m 128 ")) << table;  // both
}

TEST(SketchTuneReport, NamesPerLayerPlansAndFitsTheirRows) {
  SketchPlan per_layer = plan(2, 32, 0, 4, 0.81);
  per_layer.per_layer = {{"features.3", {2, 16}}, {"head", {1, 8}}};
  per_layer.verdict = "chosen";
  SketchTuneResult result = searched({per_layer, plan(2, 32, 0, 3, 0.84)});
  result.chosen = 0;
  const std::string table = format_sketch_table(result);
  // The per-layer parts after the model-wide ones; a layer at other terms says so.
  const std::string name = "L 2 k 32, features.3 at k 16, head at L 1 k 8";
  EXPECT_TRUE(Contains(table, "\n" + name + " ")) << table;
  // The plan column as wide as the longest name: the parameters column right-aligned in 11 after it.
  EXPECT_EQ(table.find("parameters") - table.find("plan"), name.size() + 2) << table;
  const auto row = table.find("\n" + name);
  EXPECT_EQ(table.substr(row + 1 + name.size(), 12), fmt::format(" {:>11}", per_layer.parameters)) << table;
}

TEST(SketchTuneReport, ASearchWithoutAPlanSaysWhyInOneLine) {
  // None faster than dense: none trained, and the line says so.
  const std::string slower = no_plan_message(searched({plan(1, 0, 256, 0.1, {}), plan(1, 8, 256, 0.9, {})}));
  EXPECT_EQ(slower,
            "no sketched plan of rows.pt reaches 0.8 on the validation split: none was trained, none is faster than "
            "the dense model at batch 64 (dense 0.8500)");
  // Faster plans that were not trained (the time budget ran out): no claim about their speed.
  const std::string untrained = no_plan_message(searched({plan(1, 0, 32, 1.5, {})}));
  EXPECT_EQ(untrained, "no sketched plan of rows.pt reaches 0.8 on the validation split: none was trained (dense 0.8500)");
  // Trained below the target: the most accurate is named.
  const std::string below = no_plan_message(searched({plan(1, 0, 32, 1.6, 0.7), plan(1, 8, 32, 1.4, 0.75)}));
  EXPECT_TRUE(Contains(below, "the most accurate trained, L 1 k 8 m 32, reached 0.7500 (dense 0.8500)")) << below;
}

}  // namespace
}  // namespace afterburner::tune
