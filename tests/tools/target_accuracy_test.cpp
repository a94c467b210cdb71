// --target-accuracy with --eval-every on the real Fashion-MNIST: the run stops at the first
// evaluation that reaches the target and reports when that was.
#include <gtest/gtest.h>

#include <fstream>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

TEST(CliTargetAccuracy, StopsAtTheFirstEvaluationReachingTheTarget) {
  TempDir dir;
  auto result = run_cli(train_args(fashion_mnist_dir(), {{"--threads", "2"},
                                                         {"--workers", "1"},
                                                         {"--target-accuracy", "0.5"},
                                                         {"--eval-every", "20"},
                                                         {"--report", (dir / "report.json").string()},
                                                         {"--log-jsonl", (dir / "log.jsonl").string()}}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(dir / "report.json");
  EXPECT_EQ(report.at("stop_reason"), "target accuracy reached");
  ASSERT_TRUE(report.at("train_seconds_to_target").is_number());
  double to_target = report.at("train_seconds_to_target");
  EXPECT_GT(to_target, 0);
  EXPECT_LE(to_target, report.at("train_seconds").get<double>());
  EXPECT_GE(report.at("test_accuracy").get<double>(), 0.5);
  int64_t steps = report.at("steps");
  EXPECT_EQ(steps % 20, 0);
  EXPECT_LT(steps, 60000 / 128);  // stopped within the epoch

  std::vector<nlohmann::json> evaluations;
  std::ifstream log(dir / "log.jsonl");
  for (std::string line; std::getline(log, line);) {
    auto event = nlohmann::json::parse(line);
    if (event.at("event") == "eval") evaluations.push_back(event);
  }
  ASSERT_FALSE(evaluations.empty());
  for (size_t i = 0; i + 1 < evaluations.size(); ++i) {
    EXPECT_LT(evaluations[i].at("test_accuracy").get<double>(), 0.5) << evaluations[i].dump();
  }
  const auto& last = evaluations.back();
  EXPECT_GE(last.at("test_accuracy").get<double>(), 0.5);
  EXPECT_EQ(last.at("step"), steps);
  EXPECT_EQ(last.at("train_seconds").get<double>(), to_target);
}

}  // namespace
}  // namespace afterburner::testing
