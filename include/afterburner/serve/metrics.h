// Per-model serving counters, updated lock-free by the batcher and the service, exposed in the
// Prometheus text format at /metrics.
//
//   afterburner::serve::ModelMetrics cnn;
//   cnn.request_success += 1;
//   std::string text = afterburner::serve::prometheus_text({{"cnn", &cnn}});
//   // afterburner_request_success_total{model="cnn"} 1
//   cnn.request_duration.observe(1800);   // microseconds: afterburner_request_duration_seconds_bucket{le="0.002"}
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace afterburner::serve {

// A Prometheus histogram of integer observations (microseconds, samples), updated lock-free.
class Histogram {
 public:
  // `upper_bounds` ascending (an +Inf bucket follows them); exposed multiplied by `unit`.
  Histogram(std::vector<uint64_t> upper_bounds, double unit);
  void observe(uint64_t value);

  const std::vector<uint64_t>& upper_bounds() const { return bounds_; }
  double unit() const { return unit_; }
  // Observations at most each bound, +Inf's (all) last: Prometheus' cumulative buckets.
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<uint64_t> bounds_;
  double unit_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, +Inf's last
  std::atomic<uint64_t> sum_{0};
};

struct ModelMetrics {
  std::atomic<uint64_t> request_success{0};
  std::atomic<uint64_t> request_failure{0};
  std::atomic<uint64_t> request_rejected{0};     // of the failures: 503 at once (queue full, shutting down)
  std::atomic<uint64_t> inference_count{0};      // samples run (a request may hold several)
  std::atomic<uint64_t> execution_count{0};      // forwards run (batches)
  std::atomic<uint64_t> queue_duration_us{0};    // summed over requests: arrival to batch start
  std::atomic<uint64_t> compute_duration_us{0};  // summed over executions: batch start to outputs
  std::atomic<int64_t> pending_requests{0};      // accepted, not yet answered
  // Requests answered with outputs, from arrival at the service to the answer, in microseconds.
  Histogram request_duration{{500, 1'000, 2'000, 5'000, 10'000, 20'000, 50'000, 100'000, 200'000, 500'000,
                              1'000'000, 2'000'000, 5'000'000, 10'000'000},
                             1e-6};
  Histogram batch_size{{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048}, 1};  // samples per execution
};

// The exposition text for every model: one # HELP and # TYPE per metric, one line per model.
std::string prometheus_text(const std::vector<std::pair<std::string_view, const ModelMetrics*>>& models);

}  // namespace afterburner::serve
