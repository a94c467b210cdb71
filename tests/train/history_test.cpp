#include "afterburner/train/history.h"

#include <cmath>
#include <limits>

#include "testing.h"

namespace afterburner::train {
namespace {

StepInfo step(int64_t number, double loss) {
  StepInfo info;
  info.step = number;
  info.epoch = number / 4;
  info.epochs = 3;
  info.samples = 32;
  info.loss = loss;
  info.step_seconds = 0.01 * static_cast<double>(number);  // 32 samples in 10, 20, 30 ms ...
  info.phase_seconds = {0.001, 0.002, 0.003, 0.004};
  info.train_seconds = 0.5 * static_cast<double>(number);
  info.rss_mb = 100 + static_cast<double>(number);
  info.tensor_mb = 2;
  return info;
}

TEST(TrainingHistory, RecordsEveryStepAndEvaluationAsColumns) {
  TrainingHistory history;
  history.describe("cnn", "validation");
  history.on_step_end(step(1, 2.0));
  history.on_step_end(step(2, 1.5));
  EvalInfo evaluation;
  evaluation.step = 2;
  evaluation.train_seconds = 1.0;
  evaluation.result.accuracy = 0.75;
  evaluation.result.loss = 0.6;
  history.on_evaluation(evaluation);
  const nlohmann::json curves = history.to_json();
  EXPECT_EQ(curves["model"], "cnn");
  EXPECT_EQ(curves["evaluated_on"], "validation");
  EXPECT_EQ(curves["epochs"], 3);
  EXPECT_EQ(curves["finished"], false);
  EXPECT_EQ(curves["stride"], 1);
  EXPECT_EQ(curves["steps"]["step"], nlohmann::json({1, 2}));
  EXPECT_EQ(curves["steps"]["loss"], nlohmann::json({2.0, 1.5}));
  EXPECT_EQ(curves["steps"]["train_seconds"], nlohmann::json({0.5, 1.0}));
  EXPECT_DOUBLE_EQ(curves["steps"]["samples_per_sec"][0].get<double>(), 3200);
  EXPECT_DOUBLE_EQ(curves["steps"]["samples_per_sec"][1].get<double>(), 1600);
  EXPECT_DOUBLE_EQ(curves["steps"]["data_ms"][0].get<double>(), 1);
  EXPECT_DOUBLE_EQ(curves["steps"]["optimizer_ms"][1].get<double>(), 4);
  EXPECT_EQ(curves["steps"]["rss_mb"], nlohmann::json({101.0, 102.0}));
  EXPECT_EQ(curves["evaluations"]["accuracy"], nlohmann::json({0.75}));
  EXPECT_EQ(curves["evaluations"]["train_seconds"], nlohmann::json({1.0}));
  EXPECT_FALSE(curves.contains("report"));
  EXPECT_EQ(history.to_json(), curves);  // reading changes nothing

  TrainReport report;
  report.stop_reason = "completed";
  history.on_train_end(report);
  EXPECT_EQ(history.to_json()["finished"], true);
  EXPECT_EQ(history.to_json()["stop_reason"], "completed");
  EXPECT_EQ(history.to_json()["report"]["stop_reason"], "completed");
}

// Past max_rows, pairs of rows merge: their loss and phase times averaged, samples/s over their
// summed time, the rest the later step's; then each row takes twice the steps.
TEST(TrainingHistory, LongRunsKeepFewRowsOfMeans) {
  TrainingHistory history(/*max_rows=*/4);
  for (int64_t number = 1; number <= 9; ++number) history.on_step_end(step(number, static_cast<double>(number)));
  const nlohmann::json curves = history.to_json();
  // The fourth row merged rows 1-4 into two of two steps; the eighth step made four rows again,
  // merged into two of four steps; step 9 waits in a row of its own until three more come.
  EXPECT_EQ(curves["stride"], 4);
  EXPECT_EQ(curves["steps"]["step"], nlohmann::json({4, 8, 9}));
  EXPECT_EQ(curves["steps"]["loss"], nlohmann::json({2.5, 6.5, 9.0}));
  EXPECT_EQ(curves["steps"]["epoch"], nlohmann::json({1, 2, 2}));
  EXPECT_DOUBLE_EQ(curves["steps"]["samples_per_sec"][0].get<double>(), 128 / 0.1);
  EXPECT_DOUBLE_EQ(curves["steps"]["forward_ms"][1].get<double>(), 2);
  EXPECT_EQ(curves["steps"]["rss_mb"][1], 108.0);
  EXPECT_EQ(curves["steps"]["train_seconds"], nlohmann::json({2.0, 4.0, 4.5}));
}

TEST(TrainingHistory, ANonFiniteLossIsWrittenNull) {
  TrainingHistory history;
  history.on_step_end(step(1, std::numeric_limits<double>::quiet_NaN()));
  EXPECT_TRUE(history.to_json()["steps"]["loss"][0].is_null());
}

}  // namespace
}  // namespace afterburner::train
