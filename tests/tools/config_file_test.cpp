// --config FILE: TOML options under the flags, and errors that name the file and the key.
#include <gtest/gtest.h>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

class CliConfigFile : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_mnist(dir_.path(), 512, 256); }

  // A run with `toml` as --config plus `flags`. train_args sets no --max-steps: the runs
  // that train set it in the file or by flag.
  CommandResult train(const std::string& toml, std::map<std::string, std::string> flags = {}) {
    write_file(config_path(), toml);
    flags["--config"] = config_path().string();
    flags["--report"] = report_path().string();
    return run_cli(train_args(dir_.path(), flags));
  }
  std::filesystem::path config_path() const { return dir_ / "run.toml"; }
  std::filesystem::path report_path() const { return dir_ / "report.json"; }

  TempDir dir_;
};

TEST_F(CliConfigFile, FileValuesAreHonoured) {
  auto result = train("batch_size = 64\nmax_steps = 5\nmodel = \"mlp\"\naugment = false\n");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(report_path());
  EXPECT_EQ(report.at("batch_size"), 64);
  EXPECT_EQ(report.at("steps"), 5);
  EXPECT_EQ(report.at("model"), "mlp");
}

// --print-config writes TOML that --config reads back to the same options, and the report
// records the options the run used.
TEST_F(CliConfigFile, PrintedConfigRoundTripsAndIsWhatTheReportRecords) {
  auto printed = run_cli(train_args(dir_.path(), {{"--print-config", ""}, {"--lr", "0.0625"}, {"--no-augment", ""},
                                                  {"--max-steps", "3"}, {"--model", "mlp"}}));
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_NE(printed.out.find("lr = 0.0625\n"), std::string::npos) << printed.out;
  EXPECT_FALSE(std::filesystem::exists(report_path()));  // printing trains nothing

  write_file(config_path(), printed.out);
  auto reprinted = run_cli({"train", "--config", config_path().string(), "--print-config"});
  ASSERT_EQ(reprinted.exit_code, 0) << reprinted.err;
  EXPECT_EQ(reprinted.out, printed.out);

  auto result = train(printed.out, {{"--report", report_path().string()}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto recorded = read_json(report_path()).at("config");
  EXPECT_EQ(recorded.at("lr"), "0.0625");
  EXPECT_EQ(recorded.at("augment"), "false");
  EXPECT_EQ(recorded.at("report"), report_path().string());
  EXPECT_EQ(read_json(report_path()).at("steps"), 3);
}

TEST_F(CliConfigFile, FlagsOverrideTheFile) {
  auto result = train("batch_size = 64\nmax_steps = 5\nthreads = 2\n", {{"--batch-size", "32"}, {"--max-steps", "4"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto report = read_json(report_path());
  EXPECT_EQ(report.at("batch_size"), 32);
  EXPECT_EQ(report.at("steps"), 4);
  EXPECT_EQ(report.at("threads"), 1);  // train_args passes --threads 1
}

TEST_F(CliConfigFile, UnknownKeyNamesTheFileAndTheKey) {
  EXPECT_TRUE(fails_with(train("batch_size = 64\nlearning_rate = 0.1\n"), 2,
                         {config_path().string(), "learning_rate", "unknown"}));
}

// The message may spell the key as in the file or as its flag, but must name both file and key.
TEST_F(CliConfigFile, BadValueNamesTheFileAndTheKey) {
  auto result = train("batch_size = \"many\"\n");
  EXPECT_TRUE(fails_with(result, 2, {config_path().string(), "many"}));
  auto lines = error_lines(result.err);
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(lines[0].find("batch_size") != std::string::npos || lines[0].find("--batch-size") != std::string::npos)
      << lines[0];
}

TEST_F(CliConfigFile, OutOfRangeValueNamesTheFile) {
  EXPECT_TRUE(fails_with(train("lr = -0.5\n"), 2, {config_path().string(), "lr", "-0.5"}));
}

TEST_F(CliConfigFile, SyntaxErrorNamesFileAndLine) {
  EXPECT_TRUE(fails_with(train("batch_size = 64\nmax_steps = = 5\n"), 2, {config_path().string() + ":2"}));
}

TEST_F(CliConfigFile, MissingFileIsNamed) {
  auto missing = (dir_ / "missing.toml").string();
  auto result = run_cli(train_args(dir_.path(), {{"--config", missing}}));
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find(missing), std::string::npos) << result.err;
}

}  // namespace
}  // namespace afterburner::testing
