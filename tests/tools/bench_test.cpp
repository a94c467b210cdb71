// `afterburner bench sketch`: SKLinear against torch::nn::Linear as JSON, a table, and a landscape
// written as CSV and SVG. Tiny sizes and few repetitions: behaviour, never timing.
#include <gtest/gtest.h>

#include <sstream>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

std::vector<std::string> bench_args(const std::vector<std::string>& flags) {
  std::vector<std::string> args{"bench",   "sketch", "--in",   "128", "--out",     "64",
                                "--batch", "4",      "--reps", "2",   "--threads", "1"};
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}

void expect_layer(const nlohmann::json& layer, int64_t params, int64_t buffers) {
  EXPECT_EQ(layer.at("params"), params);
  EXPECT_EQ(layer.at("buffers"), buffers);
  EXPECT_EQ(layer.at("bytes"), (params + buffers) * 4);
  for (const char* step : {"forward_ms", "forward_backward_ms"}) {
    const auto& ms = layer.at(step);
    EXPECT_GT(ms.at("min").get<double>(), 0) << step;
    EXPECT_LE(ms.at("min").get<double>(), ms.at("median").get<double>()) << step;
    EXPECT_LE(ms.at("median").get<double>(), ms.at("max").get<double>()) << step;
  }
}

TEST(CliBench, SketchJsonHasEveryField) {
  auto result = run_cli(bench_args({"--terms", "2", "--rank", "4", "--json"}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto j = nlohmann::json::parse(result.out);
  EXPECT_EQ(j.at("in"), 128);
  EXPECT_EQ(j.at("out"), 64);
  EXPECT_EQ(j.at("terms"), 2);
  EXPECT_EQ(j.at("rank"), 4);
  EXPECT_EQ(j.at("batch"), 4);
  EXPECT_EQ(j.at("dtype"), "fp32");
  EXPECT_EQ(j.at("threads"), 1);
  EXPECT_EQ(j.at("reps"), 2);
  expect_layer(j.at("dense"), 128 * 64 + 64, 0);
  // Trained S1s [2, 128, 4], S2s [2, 4, 64] and bias; fixed signs U1s [2, 4, 64], U2s [2, 128, 4].
  expect_layer(j.at("sketched"), 2 * 4 * (128 + 64) + 64, 2 * 4 * (128 + 64));
  EXPECT_DOUBLE_EQ(j.at("forward_speedup").get<double>(), j["dense"]["forward_ms"]["median"].get<double>() /
                                                              j["sketched"]["forward_ms"]["median"].get<double>());
  EXPECT_DOUBLE_EQ(j.at("forward_backward_speedup").get<double>(),
                   j["dense"]["forward_backward_ms"]["median"].get<double>() /
                       j["sketched"]["forward_backward_ms"]["median"].get<double>());
  EXPECT_DOUBLE_EQ(j.at("flop_ratio").get<double>(), 128.0 * 64 / (2 * 2 * 4 * (128 + 64)));
  EXPECT_DOUBLE_EQ(j.at("param_ratio").get<double>(), (128.0 * 64 + 64) / (2 * 4 * (128 + 64) + 64));
  // A step allocates at least the gradients of the weights: W's for the dense layer, S1s and
  // S2s's for the sketched one, whose step stays smaller.
  const auto dense_peak = j["dense"].at("step_peak_bytes").get<int64_t>();
  const auto sketched_peak = j["sketched"].at("step_peak_bytes").get<int64_t>();
  EXPECT_GE(dense_peak, 128 * 64 * 4);
  EXPECT_GE(sketched_peak, 2 * 4 * (128 + 64) * 4);
  EXPECT_LT(sketched_peak, dense_peak);
}

TEST(CliBench, SketchRunsInBf16) {
  auto result = run_cli(bench_args({"--dtype", "bf16", "--json"}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto j = nlohmann::json::parse(result.out);
  EXPECT_EQ(j.at("dtype"), "bf16");
  EXPECT_EQ(j.at("dense").at("bytes"), (128 * 64 + 64) * 2);
}

TEST(CliBench, SketchPrintsATableWithoutJson) {
  auto result = run_cli(bench_args({}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const char* row : {"terms 1, rank 16", "parameters", "forward FLOPs", "forward ms", "forward+backward ms"}) {
    EXPECT_TRUE(Contains(result.out, row));
  }
  EXPECT_TRUE(Contains(result.out, std::to_string(128 * 64 + 64)));
}

TEST(CliBench, LandscapeWritesCsvAndSvg) {
  TempDir dir;
  auto csv = dir / "landscape.csv", svg = dir / "landscape.svg";
  auto result = run_cli(bench_args(
      {"--landscape", "--terms-list", "1,2", "--ranks", "2,4,8", "--csv", csv.string(), "--svg", svg.string()}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::istringstream rows(read_file(csv));
  std::vector<std::string> lines;
  for (std::string line; std::getline(rows, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + 2 * 3);
  EXPECT_EQ(lines[0].rfind("in,out,batch,terms,rank,", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("128,64,4,1,2,fp32,1,2,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[6].rfind("128,64,4,2,8,fp32,1,2,", 0), 0u) << lines[6];
  const std::string plot = read_file(svg);
  EXPECT_TRUE(Contains(plot, "</svg>"));
  int cells = 0;
  for (size_t at = plot.find("class=\"cell\""); at != std::string::npos; at = plot.find("class=\"cell\"", at + 1))
    ++cells;
  EXPECT_EQ(cells, 6);
  // The table on stdout: a header and one row per (L, k).
  EXPECT_EQ(std::count(result.out.begin(), result.out.end(), '\n'), 2 + 6) << result.out;
}

TEST(CliBench, LandscapeJsonIsAnArrayOfResults) {
  auto result = run_cli(bench_args({"--landscape", "--terms-list", "1", "--ranks", "2,4", "--json"}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto j = nlohmann::json::parse(result.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0].at("rank"), 2);
  EXPECT_EQ(j[1].at("rank"), 4);
}

TEST(CliBench, UnwritableCsvIsOneErrorLineNamingTheFile) {
  TempDir dir;
  const std::string csv = (dir / "missing" / "landscape.csv").string();
  EXPECT_TRUE(fails_with(run_cli(bench_args({"--landscape", "--terms-list", "1", "--ranks", "2", "--csv", csv})), 1,
                         {csv, "cannot write"}));
}

struct BadFlags {
  std::vector<std::string> flags;
  std::vector<std::string> named;  // what the error line must mention
};

void PrintTo(const BadFlags& bad, std::ostream* out) {
  for (const auto& flag : bad.flags) *out << flag << " ";
}

class CliBenchBadFlags : public ::testing::TestWithParam<BadFlags> {};

TEST_P(CliBenchBadFlags, ExitTwoWithOneLineNamingTheFlag) {
  EXPECT_TRUE(fails_with(run_cli(bench_args(GetParam().flags)), 2, GetParam().named));
}

INSTANTIATE_TEST_SUITE_P(
    Flags, CliBenchBadFlags,
    ::testing::Values(BadFlags{{"--rank", "0"}, {"--rank", "0"}}, BadFlags{{"--terms", "abc"}, {"--terms", "abc"}},
                      BadFlags{{"--batch", "-4"}, {"--batch", "-4"}}, BadFlags{{"--reps", "0"}, {"--reps"}},
                      BadFlags{{"--dtype", "fp16"}, {"--dtype", "fp16"}}, BadFlags{{"--threads", "0"}, {"--threads"}},
                      BadFlags{{"--csv", "x.csv"}, {"--csv", "--landscape"}},
                      BadFlags{{"--landscape", "--rank", "8"}, {"--landscape", "--rank"}},
                      BadFlags{{"--landscape", "--ranks", "8,x"}, {"--ranks", "x"}},
                      BadFlags{{"--no-such-flag"}, {"--no-such-flag"}}),
    [](const auto& info) {
      std::string text;
      for (const auto& flag : info.param.flags) text += (text.empty() ? "" : " ") + flag;
      return test_name(text);
    });

TEST(CliBench, SketchNeedsInAndOut) {
  EXPECT_TRUE(fails_with(run_cli({"bench", "sketch", "--out", "8"}), 2, {"--in"}));
  EXPECT_TRUE(fails_with(run_cli({"bench", "sketch", "--in", "0", "--out", "8"}), 2, {"--in", "0"}));
}

TEST(CliBench, BenchNeedsABenchmark) {
  EXPECT_EQ(run_cli({"bench"}).exit_code, 2);
  auto help = run_cli({"bench", "sketch", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag : {"--in", "--out", "--terms", "--rank", "--batch", "--reps", "--threads", "--dtype", "--json",
                           "--landscape", "--terms-list", "--ranks", "--csv", "--svg"}) {
    EXPECT_TRUE(Contains(help.out, flag));
  }
}

}  // namespace
}  // namespace afterburner::testing
