// The command line itself: help, exit codes, and one clear error line per bad flag or value.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

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

// Each option's line in --help: "  --name TYPE=default ...".
std::string option_line(const std::string& help, const std::string& option) {
  auto at = help.find("  " + option + " ");
  if (at == std::string::npos) return "";
  return help.substr(at + 2, help.find('\n', at) - at - 2);
}

// Options show their value's type and their default as they are given: numbers are not TEXT,
// lists are comma-separated.
TEST(CliUsage, HelpShowsEachOptionsTypeAndDefault) {
  for (const char* command : {"train", "profile", "tune"}) {
    auto result = run_cli({command, "--help"});
    ASSERT_EQ(result.exit_code, 0) << result.err;
    std::istringstream lines(result.out);
    for (std::string line; std::getline(lines, line);) {
      auto text = line.find(" TEXT=");
      if (text == std::string::npos) continue;
      auto value = line.substr(text + 6, line.find(' ', text + 6) - text - 6);
      char* end = nullptr;
      std::strtod(value.c_str(), &end);
      EXPECT_FALSE(!value.empty() && *end == '\0') << command << ": a number as TEXT: " << line;
    }
    EXPECT_EQ(option_line(result.out, "--lr").rfind("--lr FLOAT=0.1 ", 0), 0u) << result.out;
    EXPECT_EQ(option_line(result.out, "--threads").rfind("--threads INT=0 ", 0), 0u) << result.out;
    EXPECT_EQ(option_line(result.out, "--workers").rfind("--workers INT|auto=0 ", 0), 0u) << result.out;
    EXPECT_EQ(option_line(result.out, "--checkpoint-layers").rfind("--checkpoint-layers INT,... ", 0), 0u)
        << result.out;
    EXPECT_EQ(option_line(result.out, "--data").rfind("--data PATH=/usr/share/datasets/fashion-mnist", 0), 0u);
    EXPECT_EQ(option_line(result.out, "--optimizer").rfind("--optimizer TEXT=sgd ", 0), 0u) << result.out;
  }
  const auto profile = run_cli({"profile", "--help"}).out;
  EXPECT_EQ(option_line(profile, "--profile").rfind("--profile INT=20 ", 0), 0u) << profile;
  const auto tune = run_cli({"tune", "--help"}).out;
  EXPECT_EQ(option_line(tune, "--time-budget").rfind("--time-budget FLOAT=300 ", 0), 0u) << tune;
  EXPECT_EQ(option_line(tune, "--memory-budget").rfind("--memory-budget FLOAT=0 ", 0), 0u) << tune;
  const auto loadgen = run_cli({"loadgen", "--help"}).out;
  EXPECT_EQ(option_line(loadgen, "--concurrency"), "--concurrency INT,...=1,8,64") << loadgen;
  const auto bench = run_cli({"bench", "sketch", "--help"}).out;
  EXPECT_EQ(option_line(bench, "--terms-list").rfind("--terms-list INT,...=1,2,4 ", 0), 0u) << bench;
  EXPECT_EQ(option_line(bench, "--ranks").rfind("--ranks INT,...=8,16,32,64 ", 0), 0u) << bench;
  const auto serve = run_cli({"serve", "--help"}).out;
  const auto batching = serve.find("--batching");
  ASSERT_NE(batching, std::string::npos) << serve;
  EXPECT_NE(serve.substr(batching, serve.find("\n  --", batching) - batching).find("on by default"), std::string::npos)
      << serve;
}

// A list given as --help shows it is taken as given.
TEST(CliUsage, ListsAreGivenAsHelpShowsThem) {
  auto printed = run_cli({"train", "--checkpoint-layers", "0,2", "--print-config"});
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_NE(printed.out.find("checkpoint_layers = '0,2'"), std::string::npos) << printed.out;
  EXPECT_TRUE(fails_with(run_cli({"loadgen", "--model", "cnn", "--concurrency", "1,x"}), 2, {"--concurrency", "1,x"}));
  EXPECT_TRUE(fails_with(run_cli({"loadgen", "--model", "cnn", "--concurrency", "0"}), 2, {"--concurrency", "0"}));
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
