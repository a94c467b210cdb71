#include "afterburner/serve/metrics.h"

#include <fmt/format.h>

#include <iterator>

namespace afterburner::serve {

namespace {

struct MetricFamily {
  std::string_view name;
  std::string_view type;
  std::string_view help;
  int64_t (*value)(const ModelMetrics&);
};

template <typename T>
int64_t load(const std::atomic<T>& counter) {
  return static_cast<int64_t>(counter.load(std::memory_order_relaxed));
}

const MetricFamily kFamilies[] = {
    {"afterburner_request_success_total", "counter", "Inference requests answered with outputs.",
     [](const ModelMetrics& m) { return load(m.request_success); }},
    {"afterburner_request_failure_total", "counter", "Inference requests answered with an error.",
     [](const ModelMetrics& m) { return load(m.request_failure); }},
    {"afterburner_inference_count_total", "counter", "Samples run through the model.",
     [](const ModelMetrics& m) { return load(m.inference_count); }},
    {"afterburner_execution_count_total", "counter", "Model executions (batches).",
     [](const ModelMetrics& m) { return load(m.execution_count); }},
    {"afterburner_queue_duration_us_total", "counter",
     "Microseconds requests waited in the queue, summed over requests.",
     [](const ModelMetrics& m) { return load(m.queue_duration_us); }},
    {"afterburner_compute_duration_us_total", "counter",
     "Microseconds spent running batches (inputs to outputs), summed over executions.",
     [](const ModelMetrics& m) { return load(m.compute_duration_us); }},
    {"afterburner_pending_requests", "gauge", "Requests accepted and not yet answered.",
     [](const ModelMetrics& m) { return load(m.pending_requests); }},
};

// Label values escape backslash, double quote and newline (Prometheus text format 0.0.4).
std::string escape_label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string prometheus_text(const std::vector<std::pair<std::string_view, const ModelMetrics*>>& models) {
  std::string text;
  auto out = std::back_inserter(text);
  for (const auto& family : kFamilies) {
    fmt::format_to(out, "# HELP {} {}\n# TYPE {} {}\n", family.name, family.help, family.name, family.type);
    for (const auto& [model, metrics] : models) {
      fmt::format_to(out, "{}{{model=\"{}\"}} {}\n", family.name, escape_label(model), family.value(*metrics));
    }
  }
  return text;
}

}  // namespace afterburner::serve
