// A dynamic batcher: requests queue up, and one worker thread per model instance runs them
// in batches, one forward per batch.
//
//   Batcher batcher(config, {run_instance_0, run_instance_1}, metrics);
//   batcher.submit({input}, [](BatchResult result) { ... result.outputs ... });
//   batcher.shutdown();  // runs what is queued, then stops
//
// A worker takes the queued requests in order, up to max_batch_size samples. It runs at once
// when that fills the batch, when a prefix of the queue makes a preferred batch size (the
// largest it can), or when max_queue_delay_us has passed since the oldest request arrived;
// until then it waits for more. Before serving, each worker warms its instance up with every
// batch size from 1 to max_batch_size, so that no request pays for first-call costs; with a
// `warm_up_lock`, holding it (ModelService shares one between its batchers and its loading).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "afterburner/serve/metrics.h"
#include "afterburner/serve/repository.h"

namespace afterburner::serve {

// Runs one batch through one model instance: inputs and outputs in the config's order, batch first.
using Runner = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct BatchResult {
  int status = 200;                 // else an error status with `error`
  std::string error;
  std::vector<at::Tensor> outputs;  // this request's rows of the batch's outputs
};

// Called exactly once per submitted request, on the submitting thread for a refusal, else on a worker.
using BatchCallback = std::function<void(BatchResult)>;

class Batcher {
 public:
  // One worker thread per runner. `metrics`, and `warm_up_lock` where given, must outlive the
  // batcher.
  Batcher(ModelConfig config, std::vector<Runner> runners, ModelMetrics& metrics,
          std::mutex* warm_up_lock = nullptr);
  ~Batcher();  // shutdown()
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // `inputs` share their first (batch) dimension. Refused at once: 400 for a batch above
  // max_batch_size, 503 when the queue is full or the batcher is shut down. A request still
  // queued timeout_us after it arrived fails with 504 without running.
  void submit(std::vector<at::Tensor> inputs, BatchCallback done);

  // Why submit() would refuse a request now with 503 (queue full, shutting down), if it would:
  // asked before a request is parsed, so that shedding load costs no parsing.
  std::optional<std::string> refusal() const;

  // Every worker has warmed up its instance.
  bool ready() const;
  // Blocks until ready; throws Error with the cause if a warm-up failed.
  void wait_until_ready() const;

  // Runs every queued request, then joins the workers. Later submits are refused (503).
  void shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    std::vector<at::Tensor> inputs;
    int64_t samples;
    Clock::time_point arrival;
    BatchCallback done;
  };

  void work(std::size_t instance);
  void warm_up(const Runner& runner);
  std::vector<Pending> next_batch(std::unique_lock<std::mutex>& lock);
  std::size_t ready_prefix(bool deadline_passed) const;
  std::optional<std::string> refusal_locked() const;
  void fail_expired(std::unique_lock<std::mutex>& lock);
  void run_batch(const Runner& runner, std::vector<Pending> batch);

  const ModelConfig config_;
  const std::vector<Runner> runners_;
  ModelMetrics& metrics_;
  std::mutex* const warm_up_lock_;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::size_t warmed_up_ = 0;
  std::string warm_up_error_;
  std::vector<std::thread> workers_;
};

}  // namespace afterburner::serve
