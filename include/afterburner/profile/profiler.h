// LibTorch's operator profiler over a scope: a per-op table, a Chrome trace and a JSON report.
//
//   profile::Profiler profiler(profile::ProfilerOptions().record_shapes(true));
//   auto loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
//   loss.backward();
//   profile::ProfileResult result = profiler.stop();
//   std::cout << result.table(/*top_n=*/15);
//   result.write_chrome_trace("step.trace.json");   // open in https://ui.perfetto.dev
//   nlohmann::json report = result.to_json();
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/arg.h>

namespace afterburner::profile {

struct ProfilerOptions {
  // Record each op's input shapes (into the trace's args); costs a little per op.
  TORCH_ARG(bool, record_shapes) = false;
};

// One op call as the profiler saw it. Times are microseconds since the profiler started.
struct OpEvent {
  std::string name;     // "aten::conv2d", or a user scope's name
  uint64_t thread = 0;  // LibTorch's per-thread id (small, sequential)
  double start_us = 0;
  double duration_us = 0;
  double self_us = 0;  // duration minus the time of the ops nested directly in it
  std::vector<std::vector<int64_t>> input_shapes;  // empty unless record_shapes
};

// All calls of one op name.
struct OpStats {
  std::string name;
  int64_t calls = 0;
  double self_us = 0;
  // Time inside the op, nested ops included. A call nested in a call of the same name (recursion)
  // is counted once, through its outermost call.
  double total_us = 0;
};

// {"name", "calls", "self_us", "total_us"}
void to_json(nlohmann::json& out, const OpStats& stats);

class ProfileResult {
 public:
  ProfileResult() = default;
  // Nests the events per thread by their time ranges and computes every self_us (the given
  // self_us are ignored). `wall_us` is how long the profiler ran.
  ProfileResult(std::vector<OpEvent> events, double wall_us);

  // Sorted by thread, then start; an enclosing event comes before the events it contains.
  const std::vector<OpEvent>& events() const { return events_; }
  double wall_us() const { return wall_us_; }
  // Sum of all self times: the time spent in ops, each instant counted once per thread.
  double self_us() const { return self_us_; }

  // Largest self time first.
  const std::vector<OpStats>& ops_by_self_time() const { return ops_; }

  // An aligned table of the top_n ops by self time: name (over 60 characters: "..." and its
  // tail), calls, self ms, self %, total ms;
  // self % is of self_us(). Ends with a newline.
  std::string table(size_t top_n = 20) const;

  // Chrome trace JSON: {"traceEvents": [complete ("X") events with ts/dur in microseconds,
  // pid, tid and args.input_shapes when recorded]}. Written to a temporary file next to
  // `path`, then renamed over it. Throws afterburner::Error naming `path` on failure.
  void write_chrome_trace(const std::string& path) const;

  // {"wall_us", "self_us", "ops": [OpStats as above, largest self time first]}
  nlohmann::json to_json() const;

 private:
  std::vector<OpEvent> events_;
  std::vector<OpStats> ops_;
  double wall_us_ = 0;
  double self_us_ = 0;
};

// Records every LibTorch op on this thread (and the threads it hands work to, such as
// autograd's) from construction to stop(). Uses the legacy profiler, which works without
// Kineto. One Profiler per thread at a time; construct and stop it on the same thread.
class Profiler {
 public:
  // Throws afterburner::Error if a LibTorch profiler already runs on this thread.
  explicit Profiler(ProfilerOptions options = {});
  // Stops profiling (discarding the events) if stop() was not called.
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Throws afterburner::Error when called twice.
  ProfileResult stop();

 private:
  bool running_ = true;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace afterburner::profile
