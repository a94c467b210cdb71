// What the HTTP and gRPC load runs share (serve/loadgen.h): one client thread's samples, the
// options' checks, each thread's share of them, and the merge of the threads' samples.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "afterburner/serve/loadgen.h"

namespace afterburner::serve::load {

// What one client thread saw; the threads' samples are merged into one LoadResult.
struct RunSamples {
  double seconds = 0;  // from the first send to the last answer
  std::vector<double> latencies_ms, accepted_ms;
  std::map<int, std::uint64_t> statuses;
  std::uint64_t timeouts = 0, connection_errors = 0;
};

void validate(const LoadOptions& options);
// Thread i of options.threads(): its share of the connections and of the arrival rate, its seed.
LoadOptions share_of(const LoadOptions& options, int i);
LoadResult merge(const LoadOptions& options, std::vector<RunSamples> runs);

// Validates the options, runs `run(share)` for each thread's share of them (on this thread when
// there is one) and merges what they saw; an exception in any thread is rethrown.
// One client thread's closed loop of ModelInfer calls on a gRPC server (grpc_load.cpp).
RunSamples run_grpc(const LoadOptions& options);

LoadResult run_threads(const LoadOptions& options, const std::function<RunSamples(const LoadOptions&)>& run);

}  // namespace afterburner::serve::load
