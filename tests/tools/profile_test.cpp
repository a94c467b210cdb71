// `afterburner profile`: an op table of exactly the profiled steps and a Chrome trace.
#include <gtest/gtest.h>

#include <regex>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

// The "Calls" column of `op`'s row in the op table, or -1 without such a row.
int64_t calls_in_table(const std::string& table, const std::string& op) {
  std::smatch match;
  std::regex row("(^|\\n)" + op + "\\s+(\\d+)\\s");
  return std::regex_search(table, match, row) ? std::stoll(match[2]) : -1;
}

TEST(CliProfile, PrintsTheOpTableOfTheProfiledStepsAndWritesATrace) {
  TempDir dir;
  write_synthetic_mnist(dir.path(), 512, 64);
  auto trace = dir / "trace.json";
  auto args = train_args(dir.path(), {{"--model", "cnn"},
                                      {"--batch-size", "16"},
                                      {"--max-steps", "40"},
                                      {"--profile", "10"},
                                      {"--trace", trace.string()},
                                      {"--report", (dir / "report.json").string()}});
  args[0] = "profile";
  auto result = run_cli(args);
  ASSERT_EQ(result.exit_code, 0) << result.err;

  EXPECT_NE(result.out.find("aten::"), std::string::npos) << result.out;
  // The cnn has two convolutions: 10 profiled steps run 20 convolution backwards.
  EXPECT_EQ(calls_in_table(result.out, "aten::convolution_backward"), 20) << result.out;
  auto report = read_json(dir / "report.json");
  EXPECT_EQ(report.at("stop_reason"), "profiled");
  EXPECT_LT(report.at("steps").get<int64_t>(), 40);

  auto events = read_json(trace).at("traceEvents");
  ASSERT_TRUE(events.is_array());
  int64_t convolution_backwards = 0;
  for (const auto& event : events) {
    if (event.value("name", "") == "aten::convolution_backward") ++convolution_backwards;
  }
  EXPECT_EQ(convolution_backwards, 20);
}

}  // namespace
}  // namespace afterburner::testing
