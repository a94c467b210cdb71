#include "afterburner/infer/measure.h"

#include <fmt/format.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>

#include "afterburner/core/error.h"

namespace afterburner::infer {

const SpeedPoint& Speed::best() const {
  if (points.empty()) throw Error("measure: no batch sizes were measured");
  return *std::max_element(points.begin(), points.end(), [](const auto& a, const auto& b) {
    return a.samples_per_second < b.samples_per_second;
  });
}

std::string describe(const SpeedPoint& point) {
  return fmt::format("batch {}: {:.0f} samples/s, latency p50 {:.3f} ms, p99 {:.3f} ms ({} call{} timed)",
                     point.batch_size, point.samples_per_second, point.p50_ms, point.p99_ms, point.calls,
                     point.calls == 1 ? "" : "s");
}

namespace {

// Nearest-rank percentile of sorted values, q in [0, 1].
double percentile(const std::vector<double>& sorted, double q) {
  const auto rank = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(rank, sorted.size() - 1)];
}

// Rows 0..batch_size-1 of every example tensor, cycling through them when there are fewer.
std::vector<torch::jit::IValue> batch_of(const std::vector<torch::Tensor>& examples, int64_t batch_size) {
  std::vector<torch::jit::IValue> batch;
  const int64_t rows = examples[0].size(0);
  const auto index = torch::arange(batch_size, torch::kLong).remainder(rows);
  for (const auto& example : examples) {
    batch.emplace_back(batch_size <= rows ? example.slice(0, 0, batch_size).contiguous() : example.index_select(0, index));
  }
  return batch;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The untimed calls: see MeasureOptions for why the first runs whatever the budget and the rest
// only while they are cheap against it. Returns how many ran.
int warm_up(torch::jit::Module& model, const std::vector<torch::jit::IValue>& input, const MeasureOptions& options,
            Clock::time_point start) {
  const double warmup_budget = options.seconds_per_batch_size() / 4;
  int calls = 0;
  while (calls < options.warmup_calls() && (calls == 0 || seconds_since(start) < warmup_budget)) {
    model.forward(input);
    ++calls;
  }
  return calls;
}

SpeedPoint measure_batch(torch::jit::Module& model, const std::vector<torch::Tensor>& examples, int64_t batch_size,
                         const MeasureOptions& options) {
  const std::vector<torch::jit::IValue> input = batch_of(examples, batch_size);
  const auto start = Clock::now();
  SpeedPoint point;
  point.warmup_calls = warm_up(model, input, options, start);

  std::vector<double> latencies_ms;
  do {
    const auto call_start = Clock::now();
    model.forward(input);
    latencies_ms.push_back(1000.0 * seconds_since(call_start));
  } while (seconds_since(start) < options.seconds_per_batch_size());
  point.seconds = seconds_since(start);
  std::sort(latencies_ms.begin(), latencies_ms.end());
  point.batch_size = batch_size;
  point.p50_ms = percentile(latencies_ms, 0.5);
  point.p99_ms = percentile(latencies_ms, 0.99);
  point.samples_per_second = 1000.0 * static_cast<double>(batch_size) / point.p50_ms;
  point.calls = static_cast<int>(latencies_ms.size());
  return point;
}

}  // namespace

void check_measure_options(const MeasureOptions& options) {
  if (options.batch_sizes().empty()) throw UsageError("batch_sizes", "no batch size to measure");
  for (auto size : options.batch_sizes()) {
    if (size < 1) throw UsageError("batch_sizes", fmt::format("{} is not a positive batch size", size));
  }
}

Speed measure_inputs(torch::jit::Module& model, const std::vector<torch::Tensor>& examples,
                     const MeasureOptions& options) {
  check_measure_options(options);
  if (examples.empty()) throw UsageError("examples", "no example inputs");
  for (const auto& example : examples) {
    if (example.dim() == 0 || example.size(0) < 1 || example.size(0) != examples[0].size(0)) {
      throw UsageError("examples", "every example input needs the same number of rows, at least 1");
    }
  }
  c10::InferenceMode inference;
  Speed speed;
  for (auto size : options.batch_sizes()) {
    speed.points.push_back(measure_batch(model, examples, size, options));
    if (options.on_measured()) options.on_measured()(speed.points.back());
  }
  return speed;
}

Speed measure(torch::jit::Module& model, const std::vector<int64_t>& sample_shape, const MeasureOptions& options) {
  check_measure_options(options);
  std::vector<int64_t> shape{*std::max_element(options.batch_sizes().begin(), options.batch_sizes().end())};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  return measure_inputs(model, {torch::randn(shape)}, options);
}

}  // namespace afterburner::infer
