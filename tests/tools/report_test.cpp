// --report: the JSON report carries the run's settings and results, and its accuracy is the
// accuracy of the model --export writes.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <fstream>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

// Accuracy of an exported model on `test`, normalised as the trainer does: by the mean and
// (unbiased) standard deviation of the training pixels scaled to [0, 1].
double exported_accuracy(const std::filesystem::path& model_path, const SyntheticMnist& set) {
  auto train_pixels = set.train.images.to(torch::kDouble).div(255);
  double mean = train_pixels.mean().item<double>(), std = train_pixels.std().item<double>();
  auto input = set.test.images.to(torch::kDouble).div(255).sub(mean).div(std).to(torch::kFloat).unsqueeze(1);
  auto model = torch::jit::load(model_path.string());
  torch::InferenceMode inference;
  auto logits = model.forward({input}).toTensor();
  return logits.argmax(1).eq(set.test.labels.to(torch::kLong)).to(torch::kDouble).mean().item<double>();
}

TEST(CliReport, FullEpochsReportMatchesTheFlagsAndTheExportedModel) {
  TempDir dir;
  auto set = write_synthetic_mnist(dir.path(), 512, 256);
  auto result = run_cli(train_args(dir.path(), {{"--model", "cnn"},
                                                {"--epochs", "2"},
                                                {"--batch-size", "64"},
                                                {"--workers", "1"},
                                                {"--report", (dir / "report.json").string()},
                                                {"--export", (dir / "model.pt").string()}}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("model cnn"), std::string::npos) << result.out;

  auto report = read_json(dir / "report.json");
  EXPECT_EQ(report.at("model"), "cnn");
  EXPECT_EQ(report.at("precision"), "fp32");
  EXPECT_EQ(report.at("batch_size"), 64);
  EXPECT_EQ(report.at("threads"), 1);
  EXPECT_EQ(report.at("workers"), 1);
  EXPECT_EQ(report.at("steps"), 2 * 512 / 64);
  EXPECT_EQ(report.at("stop_reason"), "completed");
  EXPECT_TRUE(report.at("train_seconds_to_target").is_null());

  double accuracy = report.at("test_accuracy");
  EXPECT_GE(accuracy, 0.0);
  EXPECT_LE(accuracy, 1.0);
  auto per_epoch = report.at("test_accuracy_per_epoch").get<std::vector<double>>();
  ASSERT_EQ(per_epoch.size(), 2u);
  for (double a : per_epoch) EXPECT_TRUE(a >= 0 && a <= 1) << a;
  EXPECT_EQ(per_epoch.back(), accuracy);
  auto epoch_seconds = report.at("epoch_seconds").get<std::vector<double>>();
  ASSERT_EQ(epoch_seconds.size(), 2u);
  for (double s : epoch_seconds) EXPECT_GT(s, 0);
  EXPECT_GT(report.at("train_samples_per_sec").get<double>(), 0);
  EXPECT_GT(report.at("peak_rss_mb").get<double>(), 0);

  // Evaluated independently, the exported model scores what the report says (up to one test
  // image, for a float rounding that could flip a near tie).
  EXPECT_NEAR(exported_accuracy(dir / "model.pt", set), accuracy, 1.0 / 256);
}

TEST(CliReport, MaxStepsRunReportsItsSettingsAndLogsEveryStep) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 512, 256);
  auto result = run_cli(train_args(dir.path(), {{"--model", "mlp"},
                                                {"--max-steps", "3"},
                                                {"--threads", "2"},
                                                {"--batch-size", "32"},
                                                {"--report", (dir / "report.json").string()},
                                                {"--log-jsonl", (dir / "log.jsonl").string()}}));
  ASSERT_EQ(result.exit_code, 0) << result.err;

  auto report = read_json(dir / "report.json");
  EXPECT_EQ(report.at("model"), "mlp");
  EXPECT_EQ(report.at("batch_size"), 32);
  EXPECT_EQ(report.at("threads"), 2);
  EXPECT_EQ(report.at("workers"), 0);
  EXPECT_EQ(report.at("steps"), 3);
  EXPECT_EQ(report.at("stop_reason"), "max steps");
  EXPECT_TRUE(report.at("test_accuracy_per_epoch").empty());  // stopped mid-epoch
  EXPECT_EQ(report.at("epoch_seconds").size(), 1u);

  std::ifstream log(dir / "log.jsonl");
  std::vector<int64_t> steps;
  int evaluations = 0;
  for (std::string line; std::getline(log, line);) {
    auto event = nlohmann::json::parse(line);
    if (event.at("event") == "step") steps.push_back(event.at("step"));
    if (event.at("event") == "eval") ++evaluations;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(evaluations, 1);
}

// With a target and no --eval-every, the run evaluates 8 times an epoch and reports when and
// after how many samples the target was first reached.
TEST(CliReport, TargetAccuracyEvaluatesWithinEpochsAndReportsSamplesToTarget) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 512, 256);
  auto result = run_cli(train_args(dir.path(), {{"--model", "mlp"},
                                                {"--batch-size", "16"},
                                                {"--epochs", "3"},
                                                {"--target-accuracy", "0.9"},
                                                {"--report", (dir / "report.json").string()}}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(dir / "report.json");
  ASSERT_EQ(report.at("stop_reason"), "target accuracy reached") << report.dump(2);
  auto evaluations = report.at("evaluations");
  ASSERT_FALSE(evaluations.empty());
  for (size_t i = 0; i < evaluations.size(); ++i) {
    EXPECT_EQ(evaluations[i].at("step"), 4 * int64_t(i + 1));  // 512 / 16 = 32 steps an epoch, / 8
    EXPECT_EQ(evaluations[i].at("samples"), 16 * 4 * int64_t(i + 1));
    EXPECT_EQ(evaluations[i].at("accuracy") >= 0.9, i + 1 == evaluations.size()) << i;
  }
  EXPECT_EQ(report.at("samples_to_target"), evaluations.back().at("samples"));
  EXPECT_EQ(report.at("train_seconds_to_target"), evaluations.back().at("train_seconds"));
  EXPECT_EQ(report.at("test_accuracy"), evaluations.back().at("accuracy"));
  EXPECT_EQ(report.at("evaluated_on"), "test");
  EXPECT_GT(report.at("eval_seconds").get<double>(), 0);
}

// --validation-split trains on the rest of the training set and evaluates on the held-out part.
TEST(CliReport, ValidationSplitTrainsOnTheRestAndEvaluatesTheHeldOutPart) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 512, 256);
  auto result = run_cli(train_args(dir.path(), {{"--model", "mlp"},
                                                {"--batch-size", "32"},
                                                {"--validation-split", "0.25"},
                                                {"--report", (dir / "report.json").string()}}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(dir / "report.json");
  EXPECT_EQ(report.at("evaluated_on"), "validation");
  EXPECT_EQ(report.at("steps"), 384 / 32);
  EXPECT_NE(result.out.find("validation accuracy"), std::string::npos) << result.out;
  ASSERT_EQ(report.at("evaluations").size(), 1u);
  // Accuracy over 128 held-out samples is a multiple of 1/128.
  double accuracy = report.at("test_accuracy");
  EXPECT_DOUBLE_EQ(accuracy * 128, std::round(accuracy * 128));
}

TEST(CliReport, ProgressNoneWritesNothingToStderr) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 512, 256);
  auto result = run_cli(train_args(dir.path(), {{"--batch-size", "32"}}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(error_lines(result.err).empty()) << result.err;
}

class CliUnwritableOutput : public ::testing::TestWithParam<std::string> {};

TEST_P(CliUnwritableOutput, ExitsOneNamingThePath) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 64, 32);
  auto path = (dir / "no-such-dir" / "out").string();
  auto result = run_cli(train_args(dir.path(), {{"--max-steps", "1"}, {"--batch-size", "32"}, {GetParam(), path}}));
  EXPECT_EQ(result.exit_code, 1);
  // Only the last line: progress output may precede an error found after training.
  auto lines = error_lines(result.err);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("afterburner: " + path, 0), 0u) << result.err;
}

INSTANTIATE_TEST_SUITE_P(Flags, CliUnwritableOutput, ::testing::Values("--report", "--export", "--log-jsonl"),
                         [](const auto& info) { return test_name(info.param); });

}  // namespace
}  // namespace afterburner::testing
