// The command line itself: help, exit codes, and one clear error line per bad flag or value.
#include <gtest/gtest.h>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

void expect_mentions(const std::string& text, const std::vector<std::string>& needles) {
  for (const auto& needle : needles) EXPECT_NE(text.find(needle), std::string::npos) << needle << " in:\n" << text;
}

TEST(CliUsage, TopLevelHelpListsTheSubcommands) {
  auto result = run_cli({"--help"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  expect_mentions(result.out, {"train", "profile", "--version"});
}

TEST(CliUsage, TrainHelpListsTheKeyFlags) {
  auto result = run_cli({"train", "--help"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  expect_mentions(result.out, {"--config", "--model", "--data", "--epochs", "--batch-size", "--lr", "--precision",
                               "--workers", "--threads", "--checkpoint-dir", "--resume", "--report", "--export",
                               "--max-steps", "--target-accuracy", "--eval-every", "--progress"});
}

TEST(CliUsage, ProfileHelpListsTheProfilerFlags) {
  auto result = run_cli({"profile", "--help"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  expect_mentions(result.out, {"--profile", "--trace", "--max-steps", "--model"});
}

// Numbers out of range are refused in words, never with CLI11's 309-digit bound.
TEST(CliUsage, NumbersOutOfRangeAreRefusedInWords) {
  EXPECT_TRUE(fails_with(run_cli({"bench", "sketch", "--in", "0", "--out", "8"}), 2,
                         {"--in: must be a positive number, got '0'"}));
  EXPECT_TRUE(fails_with(run_cli({"bench", "sketch", "--in", "8", "--out", "8", "--batch", "inf"}), 2,
                         {"--batch: must be a positive number, got 'inf'"}));
  EXPECT_TRUE(fails_with(run_cli({"optimize", "in.pt", "-o", "out.pt", "--measure-seconds", "-1"}), 2,
                         {"--measure-seconds: must be a non-negative number, got '-1'"}));
}

TEST(CliUsage, NoSubcommandIsAUsageError) {
  EXPECT_EQ(run_cli({}).exit_code, 2);
}

TEST(CliUsage, UnknownFlagExitsTwoNamingIt) {
  auto result = run_cli({"train", "--no-such-flag"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--no-such-flag"), std::string::npos) << result.err;
}

// Parse errors CLI11 detects itself follow the same one-line rule as every other error.
TEST(CliUsage, ParseErrorsPrintOneAfterburnerLine) {
  EXPECT_TRUE(fails_with(run_cli({"train", "--no-such-flag"}), 2, {"--no-such-flag"}));
  EXPECT_TRUE(fails_with(run_cli({"train", "--batch-size"}), 2, {"--batch-size"}));
}

struct BadValue {
  std::string flag, value;
};

void PrintTo(const BadValue& bad, std::ostream* out) { *out << bad.flag << " " << bad.value; }

class CliBadValue : public ::testing::TestWithParam<BadValue> {};

TEST_P(CliBadValue, ExitsTwoWithOneLineNamingTheFlagAndValue) {
  const auto& [flag, value] = GetParam();
  EXPECT_TRUE(fails_with(run_cli({"train", flag, value}), 2, {flag, value}));
}

INSTANTIATE_TEST_SUITE_P(Flags, CliBadValue,
                         ::testing::Values(BadValue{"--batch-size", "abc"}, BadValue{"--precision", "fp8"},
                                           BadValue{"--lr", "-1"}, BadValue{"--epochs", "0"},
                                           BadValue{"--workers", "-3"}, BadValue{"--momentum", "1.5"},
                                           BadValue{"--progress", "loud"}, BadValue{"--optimizer", "lbfgs"},
                                           BadValue{"--seed", "1.5"}),
                         [](const auto& info) { return test_name(info.param.flag + " " + info.param.value); });

// A value given to a boolean flag must be a usage error too, not a crash.
TEST(CliUsage, BooleanFlagWithABadValueExitsTwo) {
  EXPECT_TRUE(fails_with(run_cli({"train", "--augment=maybe"}), 2, {"--augment", "maybe"}));
}

TEST(CliUsage, Fp16OnCpuIsRefusedWithOneLine) {
  EXPECT_TRUE(fails_with(run_cli({"train", "--precision", "fp16"}), 2, {"precision", "fp16", "CPU"}));
}

TEST(CliUsage, ResumeNeedsACheckpointDir) {
  EXPECT_TRUE(fails_with(run_cli({"train", "--resume"}), 2, {"--resume", "--checkpoint-dir"}));
}

TEST(CliUsage, TraceNeedsProfile) {
  EXPECT_TRUE(fails_with(run_cli({"train", "--trace", "t.json"}), 2, {"--trace", "--profile"}));
}

TEST(CliUsage, SketchSettingsNeedSketch) {
  EXPECT_TRUE(fails_with(run_cli({"train", "--sketch-rank", "8"}), 2, {"--sketch-rank", "needs --sketch"}));
  EXPECT_TRUE(fails_with(run_cli({"train", "--sketch-terms", "2"}), 2, {"--sketch-terms", "needs --sketch"}));
  EXPECT_TRUE(fails_with(run_cli({"train", "--sketch-budget", "0.5"}), 2, {"--sketch-budget", "needs --sketch"}));
}

TEST(CliUsage, UnknownModelNamesItAndTheKnownOnes) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 64, 32);
  EXPECT_TRUE(fails_with(run_cli(train_args(dir.path(), {{"--max-steps", "1"}, {"--model", "vgg"}})), 2,
                         {"vgg", "cnn", "mlp", "resnet"}));
}

}  // namespace
}  // namespace afterburner::testing
