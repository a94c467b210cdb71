#include "afterburner/serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>
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
    {"afterburner_request_rejected_total", "counter",
     "Inference requests refused at once with 503 (queue full, shutting down), among the failures.",
     [](const ModelMetrics& m) { return load(m.request_rejected); }},
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

struct HistogramFamily {
  std::string_view name;
  std::string_view help;
  const Histogram& (*histogram)(const ModelMetrics&);
};

const HistogramFamily kHistograms[] = {
    {"afterburner_request_duration_seconds",
     "Inference requests answered with outputs, from arrival at the service to the answer.",
     [](const ModelMetrics& m) -> const Histogram& { return m.request_duration; }},
    {"afterburner_batch_size", "Samples per model execution.",
     [](const ModelMetrics& m) -> const Histogram& { return m.batch_size; }},
};

void append_histogram(std::string& text, const HistogramFamily& family, std::string_view model, const Histogram& histogram) {
  auto out = std::back_inserter(text);
  const std::string label = escape_label(model);
  const std::vector<uint64_t> counts = histogram.cumulative_counts();
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const std::string le =
        i < histogram.upper_bounds().size() ? fmt::format("{}", histogram.upper_bounds()[i] * histogram.unit()) : "+Inf";
    fmt::format_to(out, "{}_bucket{{model=\"{}\",le=\"{}\"}} {}\n", family.name, label, le, counts[i]);
  }
  fmt::format_to(out, "{}_sum{{model=\"{}\"}} {}\n", family.name, label, histogram.sum() * histogram.unit());
  fmt::format_to(out, "{}_count{{model=\"{}\"}} {}\n", family.name, label, counts.back());
}

}  // namespace

Histogram::Histogram(std::vector<uint64_t> upper_bounds, double unit)
    : bounds_(std::move(upper_bounds)), unit_(unit), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i] = 0;
}

void Histogram::observe(uint64_t value) {
  const std::size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  uint64_t below = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = below += counts_[i].load(std::memory_order_relaxed);
  return counts;
}

std::string prometheus_text(const std::vector<std::pair<std::string_view, const ModelMetrics*>>& models) {
  std::string text;
  auto out = std::back_inserter(text);
  for (const auto& family : kFamilies) {
    fmt::format_to(out, "# HELP {} {}\n# TYPE {} {}\n", family.name, family.help, family.name, family.type);
    for (const auto& [model, metrics] : models) {
      fmt::format_to(out, "{}{{model=\"{}\"}} {}\n", family.name, escape_label(model), family.value(*metrics));
    }
  }
  for (const auto& family : kHistograms) {
    fmt::format_to(out, "# HELP {} {}\n# TYPE {} histogram\n", family.name, family.help, family.name);
    for (const auto& [model, metrics] : models) append_histogram(text, family, model, family.histogram(*metrics));
  }
  return text;
}

}  // namespace afterburner::serve
