#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "afterburner/core/error.h"
#include "afterburner/profile/profiler.h"
#include "testing.h"

namespace afterburner::profile {
namespace {

namespace fs = std::filesystem;

const OpStats* find_op(const ProfileResult& result, const std::string& name) {
  for (const OpStats& op : result.ops_by_self_time()) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

// A small conv net step, forward and backward, under the profiler.
ProfileResult profile_conv_step(ProfilerOptions options = {}) {
  torch::manual_seed(0);
  torch::Tensor images = torch::randn({8, 3, 32, 32});
  torch::Tensor kernel = torch::randn({16, 3, 3, 3}, torch::requires_grad());
  torch::Tensor weight = torch::randn({10, 16 * 30 * 30}, torch::requires_grad());
  torch::Tensor bias = torch::randn({10}, torch::requires_grad());
  Profiler profiler(options);
  torch::Tensor features = torch::relu(torch::conv2d(images, kernel)).flatten(1);
  torch::Tensor logits = torch::addmm(bias, features, weight.t());
  torch::mm(logits, logits.t()).sum().backward();
  return profiler.stop();
}

TEST(Profiler, FindsTheOpsWithConsistentTimes) {
  ProfileResult result = profile_conv_step();
  for (const char* name : {"aten::conv2d", "aten::addmm", "aten::mm", "aten::relu",
                           "aten::convolution_backward"}) {
    EXPECT_NE(find_op(result, name), nullptr) << name;
  }
  double self_sum = 0;
  for (const OpStats& op : result.ops_by_self_time()) {
    EXPECT_GE(op.calls, 1) << op.name;
    EXPECT_GE(op.self_us, 0) << op.name;
    EXPECT_LE(op.self_us, op.total_us + 1e-9) << op.name;
    self_sum += op.self_us;
  }
  EXPECT_NEAR(result.self_us(), self_sum, 1e-6 * self_sum);
  EXPECT_LE(result.self_us(), result.wall_us());  // one thread: ops cannot outlast the run
  const OpStats* conv = find_op(result, "aten::conv2d");
  ASSERT_NE(conv, nullptr);
  EXPECT_GT(conv->total_us, conv->self_us);  // its convolution kernels run nested in it
  const auto& ops = result.ops_by_self_time();
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end(), [](const OpStats& a, const OpStats& b) {
    return a.self_us > b.self_us;
  }));
}

// Self time partitions the time covered by ops: per thread, the self times add up to the
// durations of the outermost events, found here by brute force.
TEST(Profiler, SelfTimesAddUpToTheOutermostEvents) {
  ProfileResult result = profile_conv_step();
  const auto& events = result.events();
  auto contains = [](const OpEvent& outer, const OpEvent& inner) {
    return outer.thread == inner.thread && outer.start_us <= inner.start_us &&
           inner.start_us + inner.duration_us <= outer.start_us + outer.duration_us;
  };
  double outermost_us = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    bool nested = false;
    for (size_t j = 0; j < events.size() && !nested; ++j) {
      nested = j != i && contains(events[j], events[i]) &&
               (events[j].duration_us > events[i].duration_us || j < i);
    }
    if (!nested) outermost_us += events[i].duration_us;
  }
  EXPECT_NEAR(result.self_us(), outermost_us, 1e-6 * outermost_us);
}

// Hand-made ranges on two threads; expected values follow from the definitions.
TEST(ProfileResult, NestsPerThreadAndCountsRecursionOnce) {
  auto event = [](const std::string& name, uint64_t thread, double start, double end) {
    return OpEvent{name, thread, start, end - start, -1.0, {}};
  };
  ProfileResult result({event("D", 1, 55, 60), event("B", 2, 20, 30), event("A", 1, 0, 100),
                        event("C", 1, 50, 70), event("B", 1, 10, 40), event("A", 1, 80, 90)},
                       200);
  // Thread 1: A[0,100] holds B[10,40], C[50,70] (holding D[55,60]) and A[80,90].
  // Thread 2: B[20,30] on its own, although A on thread 1 spans it.
  const auto& ops = result.ops_by_self_time();
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[0].name, "A");
  EXPECT_EQ(ops[0].calls, 2);
  EXPECT_DOUBLE_EQ(ops[0].self_us, (100 - 30 - 20 - 10) + 10);
  EXPECT_DOUBLE_EQ(ops[0].total_us, 100);
  EXPECT_EQ(ops[1].name, "B");
  EXPECT_DOUBLE_EQ(ops[1].self_us, 30 + 10);
  EXPECT_DOUBLE_EQ(ops[1].total_us, 40);
  EXPECT_EQ(ops[2].name, "C");
  EXPECT_DOUBLE_EQ(ops[2].self_us, 15);
  EXPECT_DOUBLE_EQ(ops[2].total_us, 20);
  EXPECT_EQ(ops[3].name, "D");
  EXPECT_DOUBLE_EQ(ops[3].self_us, 5);
  EXPECT_DOUBLE_EQ(result.self_us(), 100 + 10);
  EXPECT_DOUBLE_EQ(result.wall_us(), 200);
  EXPECT_EQ(result.events().front().name, "A");  // enclosing event first
}

TEST(ProfileResult, TableIsAlignedAndCutAtTopN) {
  ProfileResult result = profile_conv_step();
  std::istringstream table(result.table(3));
  std::vector<std::string> lines;
  for (std::string line; std::getline(table, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1 + 3 + 2u);  // header, rows, "(n more ops)", self-time summary
  for (const char* column : {"Name", "Calls", "Self ms", "Self %", "Total ms"}) {
    EXPECT_NE(lines[0].find(column), std::string::npos) << column;
  }
  for (size_t row = 1; row <= 3; ++row) {
    EXPECT_EQ(lines[row].size(), lines[0].size()) << lines[row];
    EXPECT_EQ(lines[row].rfind(result.ops_by_self_time()[row - 1].name, 0), 0u) << lines[row];
  }
  EXPECT_EQ(lines[4], "(" + std::to_string(result.ops_by_self_time().size() - 3) + " more ops)");

  std::string full = result.table(1000);
  for (const char* name : {"aten::conv2d", "aten::addmm", "aten::relu"}) {
    EXPECT_NE(full.find(name), std::string::npos) << name;
  }
}

TEST(ProfileResult, ChromeTraceParsesBackWithTheOps) {
  testing::TempDir dir;
  ProfileResult result = profile_conv_step(ProfilerOptions().record_shapes(true));
  const fs::path path = dir / "step.trace.json";
  result.write_chrome_trace(path.string());
  nlohmann::json trace = nlohmann::json::parse(testing::read_file(path));
  const nlohmann::json& events = trace.at("traceEvents");
  ASSERT_EQ(events.size(), result.events().size());
  std::set<std::string> names;
  for (const nlohmann::json& event : events) {
    EXPECT_EQ(event.at("ph"), "X");
    EXPECT_GE(event.at("ts").get<double>(), 0);
    EXPECT_GE(event.at("dur").get<double>(), 0);
    EXPECT_TRUE(event.at("pid").is_number_integer());
    EXPECT_TRUE(event.at("tid").is_number_integer());
    names.insert(event.at("name").get<std::string>());
    if (event.at("name") == "aten::conv2d") {
      auto shapes = event.at("args").at("input_shapes").get<std::vector<std::vector<int64_t>>>();
      ASSERT_GE(shapes.size(), 2u);
      EXPECT_EQ(shapes[0], (std::vector<int64_t>{8, 3, 32, 32}));
      EXPECT_EQ(shapes[1], (std::vector<int64_t>{16, 3, 3, 3}));
    }
  }
  for (const char* name : {"aten::conv2d", "aten::addmm", "aten::mm", "aten::relu"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1)
      << "temporary file left behind";
}

TEST(ProfileResult, ChromeTraceIntoAMissingDirectoryNamesThePath) {
  testing::TempDir dir;
  ProfileResult result = profile_conv_step();
  const std::string path = (dir / "missing" / "step.trace.json").string();
  try {
    result.write_chrome_trace(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(ProfileResult, JsonListsOpsBySelfTime) {
  ProfileResult result = profile_conv_step();
  nlohmann::json parsed = nlohmann::json::parse(result.to_json().dump());
  EXPECT_DOUBLE_EQ(parsed.at("wall_us").get<double>(), result.wall_us());
  EXPECT_DOUBLE_EQ(parsed.at("self_us").get<double>(), result.self_us());
  const auto& ops = result.ops_by_self_time();
  ASSERT_EQ(parsed.at("ops").size(), ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const nlohmann::json& op = parsed.at("ops")[i];
    EXPECT_EQ(op.at("name"), ops[i].name);
    EXPECT_EQ(op.at("calls").get<int64_t>(), ops[i].calls);
    EXPECT_DOUBLE_EQ(op.at("self_us").get<double>(), ops[i].self_us);
    EXPECT_DOUBLE_EQ(op.at("total_us").get<double>(), ops[i].total_us);
  }
}

TEST(Profiler, OneAtATimePerThread) {
  Profiler first;
  try {
    Profiler second;
    FAIL() << "a second profiler started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("profiler"), std::string::npos) << e.what();
  }
  first.stop();
  EXPECT_THROW(first.stop(), Error);
}

TEST(Profiler, DestructorStopsProfiling) {
  { Profiler discarded; }
  Profiler next;  // would throw if the first were still running
  torch::relu(torch::randn({4}));
  ProfileResult result = next.stop();
  EXPECT_NE(find_op(result, "aten::relu"), nullptr);
}

}  // namespace
}  // namespace afterburner::profile
