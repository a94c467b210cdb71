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
  EXPECT_EQ(values["afterburner_inference_count_total{model=\"cnn\"}"], "9");
  EXPECT_EQ(values["afterburner_execution_count_total{model=\"cnn\"}"], "3");
  EXPECT_EQ(values["afterburner_queue_duration_us_total{model=\"cnn\"}"], "1500");
  EXPECT_EQ(values["afterburner_compute_duration_us_total{model=\"cnn\"}"], "4200");
  EXPECT_EQ(values["afterburner_pending_requests{model=\"cnn\"}"], "4");
  EXPECT_EQ(values["afterburner_request_success_total{model=\"mlp\"}"], "1");
  EXPECT_EQ(values["afterburner_pending_requests{model=\"mlp\"}"], "0");
  EXPECT_EQ(values.size(), 14u);
}

TEST(Metrics, EachFamilyHasOneHelpAndTypeLine) {
  ModelMetrics a;
  ModelMetrics b;
  std::string text = prometheus_text({{"a", &a}, {"b", &b}});
  for (const char* family : {"afterburner_request_success_total", "afterburner_request_failure_total",
                             "afterburner_inference_count_total", "afterburner_execution_count_total",
                             "afterburner_queue_duration_us_total", "afterburner_compute_duration_us_total"}) {
    EXPECT_EQ(count(text, std::string("# HELP ") + family + " "), 1) << family;
    EXPECT_EQ(count(text, std::string("# TYPE ") + family + " counter\n"), 1) << family;
  }
  EXPECT_EQ(count(text, "# TYPE afterburner_pending_requests gauge\n"), 1);
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
  EXPECT_EQ(count(text, "# TYPE "), 7);
}

}  // namespace
}  // namespace afterburner::serve
