#include "afterburner/serve/metrics.h"

#include <map>
#include <sstream>

#include "testing.h"

namespace afterburner::serve {
namespace {

// Sample lines "name{labels} value" of an exposition text, by "name{labels}".
std::map<std::string, std::string> samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto space = line.rfind(' ');
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(Metrics, EveryCounterOfEveryModelIsExposed) {
  ModelMetrics cnn;
  ModelMetrics mlp;
  cnn.request_success = 7;
  cnn.request_failure = 2;
  cnn.request_rejected = 1;
  cnn.inference_count = 9;
  cnn.execution_count = 3;
  cnn.queue_duration_us = 1500;
  cnn.compute_duration_us = 4200;
  cnn.pending_requests = 4;
  mlp.request_success = 1;
  std::string text = prometheus_text({{"cnn", &cnn}, {"mlp", &mlp}});
  auto values = samples(text);
  EXPECT_EQ(values["afterburner_request_success_total{model=\"cnn\"}"], "7");
  EXPECT_EQ(values["afterburner_request_failure_total{model=\"cnn\"}"], "2");
  EXPECT_EQ(values["afterburner_request_rejected_total{model=\"cnn\"}"], "1");
  EXPECT_EQ(values["afterburner_inference_count_total{model=\"cnn\"}"], "9");
  EXPECT_EQ(values["afterburner_execution_count_total{model=\"cnn\"}"], "3");
  EXPECT_EQ(values["afterburner_queue_duration_us_total{model=\"cnn\"}"], "1500");
  EXPECT_EQ(values["afterburner_compute_duration_us_total{model=\"cnn\"}"], "4200");
  EXPECT_EQ(values["afterburner_pending_requests{model=\"cnn\"}"], "4");
  EXPECT_EQ(values["afterburner_request_success_total{model=\"mlp\"}"], "1");
  EXPECT_EQ(values["afterburner_pending_requests{model=\"mlp\"}"], "0");
  // 8 counters and gauges, and 2 histograms of 15 and 13 buckets with their sum and count, per model
  EXPECT_EQ(values.size(), 2u * (8 + 17 + 15));
}

TEST(Metrics, EachFamilyHasOneHelpAndTypeLine) {
  ModelMetrics a;
  ModelMetrics b;
  std::string text = prometheus_text({{"a", &a}, {"b", &b}});
  for (const char* family : {"afterburner_request_success_total", "afterburner_request_failure_total",
                             "afterburner_request_rejected_total", "afterburner_inference_count_total", "afterburner_execution_count_total",
                             "afterburner_queue_duration_us_total", "afterburner_compute_duration_us_total"}) {
    EXPECT_EQ(count(text, std::string("# HELP ") + family + " "), 1) << family;
    EXPECT_EQ(count(text, std::string("# TYPE ") + family + " counter\n"), 1) << family;
  }
  EXPECT_EQ(count(text, "# TYPE afterburner_pending_requests gauge\n"), 1);
  EXPECT_EQ(count(text, "# TYPE afterburner_request_duration_seconds histogram\n"), 1);
  EXPECT_EQ(count(text, "# TYPE afterburner_batch_size histogram\n"), 1);
  EXPECT_EQ(text.back(), '\n');
}

TEST(Metrics, LabelValuesAreEscaped) {
  ModelMetrics m;
  m.request_success = 5;
  auto values = samples(prometheus_text({{"a\"b\\c\nd", &m}}));
  EXPECT_EQ(values["afterburner_request_success_total{model=\"a\\\"b\\\\c\\nd\"}"], "5");
}

TEST(Metrics, NoModelsGiveOnlyTheFamilies) {
  std::string text = prometheus_text({});
  EXPECT_TRUE(samples(text).empty());
  EXPECT_EQ(count(text, "# TYPE "), 10);
}

// Prometheus' histogram: cumulative buckets (an observation on a bound counts in it), +Inf,
// the sum and the count, in the exposed unit (seconds for microseconds observed).
TEST(Metrics, HistogramsAreCumulativeInTheirUnit) {
  ModelMetrics m;
  for (uint64_t microseconds : {300, 500, 501, 1'500, 20'000'000}) m.request_duration.observe(microseconds);
  for (uint64_t samples : {1, 3, 64, 64, 5000}) m.batch_size.observe(samples);
  auto values = samples(prometheus_text({{"cnn", &m}}));
  auto bucket = [&](const std::string& family, const std::string& le) {
    return values[family + "_bucket{model=\"cnn\",le=\"" + le + "\"}"];
  };
  EXPECT_EQ(bucket("afterburner_request_duration_seconds", "0.0005"), "2");
  EXPECT_EQ(bucket("afterburner_request_duration_seconds", "0.001"), "3");
  EXPECT_EQ(bucket("afterburner_request_duration_seconds", "0.002"), "4");
  EXPECT_EQ(bucket("afterburner_request_duration_seconds", "10"), "4");
  EXPECT_EQ(bucket("afterburner_request_duration_seconds", "+Inf"), "5");
  EXPECT_EQ(values["afterburner_request_duration_seconds_count{model=\"cnn\"}"], "5");
  EXPECT_NEAR(std::stod(values["afterburner_request_duration_seconds_sum{model=\"cnn\"}"]), 20.002801, 1e-9);
  EXPECT_EQ(bucket("afterburner_batch_size", "1"), "1");
  EXPECT_EQ(bucket("afterburner_batch_size", "2"), "1");
  EXPECT_EQ(bucket("afterburner_batch_size", "4"), "2");
  EXPECT_EQ(bucket("afterburner_batch_size", "64"), "4");
  EXPECT_EQ(bucket("afterburner_batch_size", "2048"), "4");
  EXPECT_EQ(bucket("afterburner_batch_size", "+Inf"), "5");
  EXPECT_EQ(values["afterburner_batch_size_sum{model=\"cnn\"}"], "5132");
}

}  // namespace
}  // namespace afterburner::serve
