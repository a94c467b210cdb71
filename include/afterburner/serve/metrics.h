// Per-model serving counters, updated lock-free by the batcher and the service, exposed in the
// Prometheus text format at /metrics.
//
//   afterburner::serve::ModelMetrics cnn;
//   cnn.request_success += 1;
//   std::string text = afterburner::serve::prometheus_text({{"cnn", &cnn}});
//   // afterburner_request_success_total{model="cnn"} 1
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace afterburner::serve {

struct ModelMetrics {
  std::atomic<uint64_t> request_success{0};
  std::atomic<uint64_t> request_failure{0};
  std::atomic<uint64_t> inference_count{0};      // samples run (a request may hold several)
  std::atomic<uint64_t> execution_count{0};      // forwards run (batches)
  std::atomic<uint64_t> queue_duration_us{0};    // summed over requests: arrival to batch start
  std::atomic<uint64_t> compute_duration_us{0};  // summed over executions: batch start to outputs
  std::atomic<int64_t> pending_requests{0};      // accepted, not yet answered
};

// The exposition text for every model: one # HELP and # TYPE per metric, one line per model.
std::string prometheus_text(const std::vector<std::pair<std::string_view, const ModelMetrics*>>& models);

}  // namespace afterburner::serve
