#include "load_run.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "afterburner/core/error.h"

namespace afterburner::serve::load {

void validate(const LoadOptions& options) {
  if (options.concurrency() < 1) throw UsageError("--concurrency", "must be at least 1");
  if (options.duration_seconds() <= 0) throw UsageError("--duration", "must be positive");
  if (options.rate() < 0) throw UsageError("--rate", "must not be negative");
  if (options.timeout().count() <= 0) throw UsageError("--timeout", "must be positive");
  if (options.threads() < 1) throw UsageError("--threads", "must be at least 1");
  if (options.threads() > options.concurrency()) throw UsageError("--threads", "must be at most --concurrency");
}

LoadOptions share_of(const LoadOptions& options, int i) {
  const int n = options.threads();
  LoadOptions share = options;
  share.concurrency(options.concurrency() / n + (i < options.concurrency() % n ? 1 : 0));
  share.rate(options.rate() / n);
  share.seed(options.seed() + static_cast<std::uint64_t>(i));
  return share;
}

LoadResult merge(const LoadOptions& options, std::vector<RunSamples> runs) {
  LoadResult result;
  result.concurrency = options.concurrency();
  result.rate = options.rate();
  std::vector<double> latencies, accepted;
  for (RunSamples& run : runs) {
    result.seconds = std::max(result.seconds, run.seconds);
    latencies.insert(latencies.end(), run.latencies_ms.begin(), run.latencies_ms.end());
    accepted.insert(accepted.end(), run.accepted_ms.begin(), run.accepted_ms.end());
    for (auto [status, count] : run.statuses) result.statuses[status] += count;
    result.timeouts += run.timeouts;
    result.connection_errors += run.connection_errors;
  }
  result.requests = latencies.size();
  result.requests_per_second = static_cast<double>(result.requests) / result.seconds;
  result.latency = summarize_latencies(std::move(latencies));
  result.accepted = accepted.size();
  result.accepted_per_second = static_cast<double>(result.accepted) / result.seconds;
  result.accepted_latency = summarize_latencies(std::move(accepted));
  return result;
}

LoadResult run_threads(const LoadOptions& options, const std::function<RunSamples(const LoadOptions&)>& run) {
  validate(options);
  if (options.threads() == 1) return merge(options, {run(options)});
  const auto n = static_cast<std::size_t>(options.threads());
  std::vector<RunSamples> runs(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        runs[i] = run(share_of(options, static_cast<int>(i)));
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return merge(options, std::move(runs));
}

}  // namespace afterburner::serve::load
