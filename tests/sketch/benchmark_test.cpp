#include "afterburner/sketch/benchmark.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "testing.h"

namespace afterburner::sketch {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::error_message;

BenchmarkOptions tiny(int64_t in = 64, int64_t out = 96) {
  return BenchmarkOptions(in, out).terms(2).rank(4).batch(3).reps(3).warmup(1);
}

void expect_ordered(const Milliseconds& ms, const std::string& what) {
  EXPECT_GT(ms.min, 0) << what;
  EXPECT_LE(ms.min, ms.median) << what;
  EXPECT_LE(ms.median, ms.max) << what;
}

// Parameters, storage and FLOPs from the layers' definitions: dense W [out, in] and b [out];
// sketched S1s [L, in, k], S2s [L, k, out] and b trained, the signs U1s [L, k, out] and
// U2s [L, in, k] fixed: 2Lk(in + out) + out elements stored in all.
void expect_sizes(const BenchmarkResult& r, int64_t in, int64_t out, int64_t terms, int64_t rank, int64_t batch,
                  int64_t element_bytes) {
  const int64_t per_term_product = terms * rank * (in + out);
  EXPECT_EQ(r.dense.params, in * out + out);
  EXPECT_EQ(r.dense.buffers, 0);
  EXPECT_EQ(r.dense.bytes, (in * out + out) * element_bytes);
  EXPECT_EQ(r.sketched.params, per_term_product + out);
  EXPECT_EQ(r.sketched.buffers, per_term_product);
  EXPECT_EQ(r.sketched.params + r.sketched.buffers, 2 * terms * rank * (in + out) + out);
  EXPECT_EQ(r.sketched.bytes, (2 * per_term_product + out) * element_bytes);
  EXPECT_EQ(r.dense.forward_flops, 2 * batch * in * out);
  EXPECT_EQ(r.sketched.forward_flops, 2 * batch * 2 * terms * rank * (in + out));
}

TEST(SketchBenchmark, ResultFieldsAreConsistent) {
  const BenchmarkResult r = benchmark_sklinear(tiny());
  EXPECT_EQ(r.options.in_features(), 64);
  EXPECT_EQ(r.options.out_features(), 96);
  EXPECT_EQ(r.options.terms(), 2);
  EXPECT_EQ(r.options.rank(), 4);
  EXPECT_EQ(r.threads, at::get_num_threads());
  expect_sizes(r, 64, 96, 2, 4, 3, sizeof(float));
  expect_ordered(r.dense.forward, "dense forward");
  expect_ordered(r.sketched.forward, "sketched forward");
  expect_ordered(r.dense.forward_backward, "dense forward+backward");
  expect_ordered(r.sketched.forward_backward, "sketched forward+backward");
  EXPECT_DOUBLE_EQ(r.forward_speedup(), r.dense.forward.median / r.sketched.forward.median);
  EXPECT_DOUBLE_EQ(r.forward_backward_speedup(), r.dense.forward_backward.median / r.sketched.forward_backward.median);
  EXPECT_DOUBLE_EQ(r.flop_ratio(), (64.0 * 96) / (2 * 2 * 4 * (64 + 96)));
  EXPECT_DOUBLE_EQ(r.param_ratio(), (64.0 * 96 + 96) / (2 * 4 * (64 + 96) + 96));
}

TEST(SketchBenchmark, Bf16HalvesTheStorage) {
  const BenchmarkResult r = benchmark_sklinear(tiny(128, 64).dtype(torch::kBFloat16));
  expect_sizes(r, 128, 64, 2, 4, 3, 2);
  expect_ordered(r.sketched.forward_backward, "sketched forward+backward");
  EXPECT_EQ(to_json(r).at("dtype"), "bf16");
}

TEST(SketchBenchmark, JsonCarriesEveryFigure) {
  const BenchmarkResult r = benchmark_sklinear(tiny());
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j.at("in"), 64);
  EXPECT_EQ(j.at("out"), 96);
  EXPECT_EQ(j.at("terms"), 2);
  EXPECT_EQ(j.at("rank"), 4);
  EXPECT_EQ(j.at("batch"), 3);
  EXPECT_EQ(j.at("dtype"), "fp32");
  EXPECT_EQ(j.at("threads"), r.threads);
  EXPECT_EQ(j.at("reps"), 3);
  for (const auto& [name, layer] : {std::pair<std::string, LayerFigures>{"dense", r.dense}, {"sketched", r.sketched}}) {
    const nlohmann::json& l = j.at(name);
    EXPECT_EQ(l.at("params"), layer.params) << name;
    EXPECT_EQ(l.at("buffers"), layer.buffers) << name;
    EXPECT_EQ(l.at("bytes"), layer.bytes) << name;
    EXPECT_EQ(l.at("forward_flops"), layer.forward_flops) << name;
    EXPECT_EQ(l.at("forward_ms").at("median"), layer.forward.median) << name;
    EXPECT_EQ(l.at("forward_ms").at("min"), layer.forward.min) << name;
    EXPECT_EQ(l.at("forward_backward_ms").at("max"), layer.forward_backward.max) << name;
  }
  EXPECT_EQ(j.at("forward_speedup"), r.forward_speedup());
  EXPECT_EQ(j.at("forward_backward_speedup"), r.forward_backward_speedup());
  EXPECT_EQ(j.at("flop_ratio"), r.flop_ratio());
  EXPECT_EQ(j.at("param_ratio"), r.param_ratio());
}

TEST(SketchBenchmark, LandscapeSweepsTermsOuterRanksInnerOnce) {
  std::vector<std::pair<int64_t, int64_t>> seen;
  const auto results = benchmark_landscape(tiny(), {2, 1, 2}, {8, 4}, [&](const BenchmarkResult& r) {
    seen.emplace_back(r.options.terms(), r.options.rank());
  });
  const std::vector<std::pair<int64_t, int64_t>> expected{{1, 4}, {1, 8}, {2, 4}, {2, 8}};
  EXPECT_EQ(seen, expected);
  ASSERT_EQ(results.size(), expected.size());
  for (size_t i = 0; i < results.size(); ++i) {
    expect_sizes(results[i], 64, 96, expected[i].first, expected[i].second, 3, sizeof(float));
    EXPECT_EQ(results[i].options.reps(), 3);
  }
}

// A result with chosen figures, so that the CSV and SVG text can be checked exactly.
BenchmarkResult made_up(int64_t terms, int64_t rank, double dense_ms, double sketched_ms) {
  BenchmarkResult r;
  r.options = BenchmarkOptions(256, 128).terms(terms).rank(rank).batch(8).reps(5);
  r.threads = 2;
  r.dense.params = 256 * 128 + 128;
  r.sketched.params = terms * rank * (256 + 128) + 128;
  r.sketched.buffers = terms * rank * (256 + 128);
  r.dense.forward_flops = 2 * 8 * 256 * 128;
  r.sketched.forward_flops = 2 * 8 * 2 * terms * rank * (256 + 128);
  r.dense.forward = {dense_ms, dense_ms / 2, dense_ms * 2};
  r.sketched.forward = {sketched_ms, sketched_ms / 2, sketched_ms * 2};
  r.dense.forward_backward = {3 * dense_ms, dense_ms, 6 * dense_ms};
  r.sketched.forward_backward = {2 * sketched_ms, sketched_ms, 4 * sketched_ms};
  return r;
}

const std::vector<BenchmarkResult> kLandscape{made_up(1, 8, 2.0, 0.5), made_up(1, 16, 2.0, 1.0),
                                              made_up(4, 8, 2.0, 5.0), made_up(4, 16, 2.0, 10.0)};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream stream(line);
  for (std::string field; std::getline(stream, field, ',');) fields.push_back(field);
  return fields;
}

TEST(SketchBenchmark, CsvHasAHeaderAndOneRowPerResult) {
  std::ostringstream out;
  write_csv(kLandscape, out);
  const auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), kLandscape.size() + 1);
  const auto header = fields_of(lines[0]);
  const auto column = [&](const std::string& name) {
    const auto found = std::find(header.begin(), header.end(), name);
    EXPECT_NE(found, header.end()) << name;
    return static_cast<size_t>(found - header.begin());
  };
  for (size_t i = 0; i < kLandscape.size(); ++i) {
    const auto row = fields_of(lines[i + 1]);
    ASSERT_EQ(row.size(), header.size()) << lines[i + 1];
    const BenchmarkResult& r = kLandscape[i];
    EXPECT_EQ(std::stoll(row[column("terms")]), r.options.terms());
    EXPECT_EQ(std::stoll(row[column("rank")]), r.options.rank());
    EXPECT_EQ(std::stoll(row[column("sketched_params")]), r.sketched.params);
    EXPECT_EQ(std::stoll(row[column("sketched_buffers")]), r.sketched.buffers);
    EXPECT_EQ(row[column("dtype")], "fp32");
    EXPECT_DOUBLE_EQ(std::stod(row[column("sketched_forward_ms")]), r.sketched.forward.median);
    EXPECT_NEAR(std::stod(row[column("forward_speedup")]), r.forward_speedup(), 1e-4);
    EXPECT_NEAR(std::stod(row[column("forward_backward_speedup")]), r.forward_backward_speedup(), 1e-4);
    EXPECT_NEAR(std::stod(row[column("flop_ratio")]), r.flop_ratio(), 1e-4);
  }
}

// Every element closed in order, no text with a bare '<' or '&': what an XML parser needs.
::testing::AssertionResult well_formed(const std::string& svg) {
  std::vector<std::string> open;
  const std::regex tag(R"(<(/?)([A-Za-z][\w:-]*)[^<>]*?(/?)>)");
  size_t position = svg.rfind("?>", svg.find("<svg"));
  if (svg.rfind("<?xml", 0) != 0 || position == std::string::npos) {
    return ::testing::AssertionFailure() << "no XML declaration";
  }
  position += 2;
  for (std::sregex_iterator it(svg.begin() + static_cast<std::ptrdiff_t>(position), svg.end(), tag), end; it != end;
       ++it) {
    const std::smatch& m = *it;
    const std::string text = svg.substr(position, static_cast<size_t>(m[0].first - svg.begin()) - position);
    if (text.find('<') != std::string::npos || std::regex_search(text, std::regex("&(?!(lt|gt|amp|quot|apos);)"))) {
      return ::testing::AssertionFailure() << "bad text '" << text << "'";
    }
    position = static_cast<size_t>(m[0].second - svg.begin());
    if (m[1] == "/") {
      if (open.empty() || open.back() != m[2]) return ::testing::AssertionFailure() << "unexpected </" << m[2] << ">";
      open.pop_back();
    } else if (m[3] != "/") {
      open.push_back(m[2]);
    }
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> never closed";
  return ::testing::AssertionSuccess();
}

int64_t count_of(const std::string& text, const std::string& part) {
  int64_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

TEST(SketchBenchmark, SvgIsWellFormedWithOneLabelledCellPerResult) {
  std::ostringstream out;
  write_svg(kLandscape, out);
  const std::string svg = out.str();
  EXPECT_TRUE(well_formed(svg)) << svg;
  EXPECT_EQ(count_of(svg, "<svg "), 1);
  EXPECT_EQ(count_of(svg, "class=\"cell\""), static_cast<int64_t>(kLandscape.size()));
  for (const std::string label : {">rank k<", ">terms L<", ">1<", ">4<", ">8<", ">16<"}) {
    EXPECT_TRUE(Contains(svg, label));
  }
  // Forward speedups 4, 2, 0.4, 0.2 and forward+backward speedups 6, 3, 0.6, 0.3.
  for (const std::string value :
       {">4.0x<", ">2.0x<", ">0.4x<", ">0.2x<", "f+b 6.0x", "f+b 3.0x", "f+b 0.6x", "f+b 0.3x"}) {
    EXPECT_EQ(count_of(svg, value), 1) << value;
  }
}

// The cells of a 2 x 2 landscape sit on two distinct rows and two distinct columns.
TEST(SketchBenchmark, SvgPlacesCellsOnTheTermsByRankGrid) {
  std::ostringstream out;
  write_svg(kLandscape, out);
  const std::string svg = out.str();
  const std::regex cell(R"re(class="cell" x="(\d+)" y="(\d+)")re");
  std::vector<std::pair<int, int>> places;
  for (std::sregex_iterator it(svg.begin(), svg.end(), cell), end; it != end; ++it) {
    places.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
  }
  ASSERT_EQ(places.size(), 4u);
  EXPECT_EQ(places[0].second, places[1].second);  // L = 1: one row
  EXPECT_LT(places[0].first, places[1].first);    // k = 8 left of k = 16
  EXPECT_EQ(places[0].first, places[2].first);    // k = 8: one column
  EXPECT_LT(places[0].second, places[2].second);  // L = 1 above L = 4
  EXPECT_EQ(places[3], std::make_pair(places[1].first, places[2].second));
}

TEST(SketchBenchmark, WritesFilesAndNamesOnesItCannotWrite) {
  afterburner::testing::TempDir dir;
  write_csv(kLandscape, (dir / "landscape.csv").string());
  write_svg(kLandscape, (dir / "landscape.svg").string());
  EXPECT_EQ(lines_of(afterburner::testing::read_file(dir / "landscape.csv")).size(), kLandscape.size() + 1);
  EXPECT_TRUE(well_formed(afterburner::testing::read_file(dir / "landscape.svg")));

  const std::string missing = (dir / "no" / "such.csv").string();
  EXPECT_TRUE(Contains(error_message<Error>([&] { write_csv(kLandscape, missing); }), missing + ": cannot write"));
}

TEST(SketchBenchmark, NothingToPlotIsAUsageErrorAndWritesNoFile) {
  afterburner::testing::TempDir dir;
  const auto path = dir / "empty.svg";
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { write_svg({}, path.string()); }), "nothing to plot"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SketchBenchmark, BadOptionsAreUsageErrorsNamingTheOption) {
  const auto message = [](const BenchmarkOptions& options) {
    return error_message<UsageError>([&] { benchmark_sklinear(options); });
  };
  EXPECT_TRUE(Contains(message(tiny(0, 8)), "in_features"));
  EXPECT_TRUE(Contains(message(tiny(8, 0)), "out_features"));
  EXPECT_TRUE(Contains(message(tiny().terms(0)), "terms"));
  EXPECT_TRUE(Contains(message(tiny().rank(-2)), "rank"));
  EXPECT_TRUE(Contains(message(tiny().batch(0)), "batch"));
  EXPECT_TRUE(Contains(message(tiny().reps(0)), "reps"));
  EXPECT_TRUE(Contains(message(tiny().warmup(-1)), "warmup"));
  EXPECT_TRUE(Contains(message(tiny().dtype(torch::kDouble)), "dtype"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { benchmark_landscape(tiny(), {}, {4}); }), "terms_list"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { benchmark_landscape(tiny(), {1}, {}); }), "ranks"));
}

}  // namespace
}  // namespace afterburner::sketch
