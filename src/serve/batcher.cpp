#include "afterburner/serve/batcher.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "afterburner/core/error.h"
#include "afterburner/serve/protocol.h"

namespace afterburner::serve {

namespace {

int64_t microseconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration_cast<std::chrono::microseconds>(duration).count();
}

// Throws Error naming the model file unless `outputs` are what the config declares for `samples`.
void check_outputs(const ModelConfig& config, const std::vector<at::Tensor>& outputs, int64_t samples) {
  const std::string file = config.model_file.string();
  if (outputs.size() != config.outputs.size()) {
    throw DataError(file, fmt::format("returns {} outputs, {} declares {}", outputs.size(),
                                      config.config_file.string(), config.outputs.size()));
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const TensorSpec& spec = config.outputs[i];
    const at::Tensor& output = outputs[i];
    bool shape_matches = output.dim() == static_cast<int64_t>(spec.dims.size()) + 1 && output.size(0) == samples;
    for (std::size_t d = 0; shape_matches && d < spec.dims.size(); ++d) {
      shape_matches = spec.dims[d] == -1 || spec.dims[d] == output.size(static_cast<int64_t>(d) + 1);
    }
    if (!shape_matches || output.scalar_type() != scalar_type(spec.datatype)) {
      throw DataError(file, fmt::format("output '{}' is {} of shape [{}] for a batch of {}, {} declares {} [batch, {}]",
                                        spec.name, at::toString(output.scalar_type()),
                                        fmt::join(output.sizes(), ", "), samples, config.config_file.string(),
                                        datatype_name(spec.datatype), fmt::join(spec.dims, ", ")));
    }
  }
}

std::vector<at::Tensor> concat_inputs(const std::vector<std::vector<at::Tensor>*>& requests) {
  if (requests.size() == 1) return *requests[0];
  std::vector<at::Tensor> batch;
  for (std::size_t i = 0; i < requests[0]->size(); ++i) {
    std::vector<at::Tensor> parts;
    parts.reserve(requests.size());
    for (const auto* inputs : requests) parts.push_back((*inputs)[i]);
    batch.push_back(at::cat(parts, 0));
  }
  return batch;
}

}  // namespace

Batcher::Batcher(ModelConfig config, std::vector<Runner> runners, ModelMetrics& metrics, std::mutex* warm_up_lock)
    : config_(std::move(config)), runners_(std::move(runners)), metrics_(metrics), warm_up_lock_(warm_up_lock) {
  if (runners_.empty()) throw UsageError(config_.name, "a batcher needs at least one model instance");
  for (std::size_t i = 0; i < runners_.size(); ++i) workers_.emplace_back([this, i] { work(i); });
}

Batcher::~Batcher() { shutdown(); }

void Batcher::submit(std::vector<at::Tensor> inputs, BatchCallback done) {
  int64_t samples = inputs.empty() || inputs[0].dim() == 0 ? 0 : inputs[0].size(0);
  if (samples < 1 || samples > config_.max_batch_size) {
    done({400, fmt::format("model '{}': batch of {} samples, it takes 1 to {} (max_batch_size)", config_.name,
                           samples, config_.max_batch_size), {}});
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (std::optional<std::string> refused = refusal_locked()) {
    lock.unlock();
    done({503, std::move(*refused), {}});
    return;
  }
  queue_.push_back({std::move(inputs), samples, Clock::now(), std::move(done)});
  metrics_.pending_requests += 1;
  lock.unlock();
  changed_.notify_all();
}

std::optional<std::string> Batcher::refusal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refusal_locked();
}

std::optional<std::string> Batcher::refusal_locked() const {
  if (stopping_) return fmt::format("model '{}' is shutting down", config_.name);
  if (static_cast<int64_t>(queue_.size()) >= config_.queue_capacity()) {
    return fmt::format("model '{}': queue full ({} requests)", config_.name, config_.queue_capacity());
  }
  return std::nullopt;
}

bool Batcher::ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return warmed_up_ == runners_.size();
}

void Batcher::wait_until_ready() const {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return warmed_up_ == runners_.size() || !warm_up_error_.empty(); });
  if (!warm_up_error_.empty()) throw Error(warm_up_error_);
}

void Batcher::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

void Batcher::work(std::size_t instance) {
  c10::InferenceMode inference_mode;
  const Runner& runner = runners_[instance];
  try {
    warm_up(runner);
    std::lock_guard<std::mutex> lock(mutex_);
    ++warmed_up_;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    warm_up_error_ = fmt::format("model '{}': warm-up failed: {}", config_.name, first_line(e));
  }
  changed_.notify_all();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    std::vector<Pending> batch = next_batch(lock);
    if (batch.empty()) return;
    lock.unlock();
    run_batch(runner, std::move(batch));
    lock.lock();
  }
}

// Every batch size once, so that allocator pools and the JIT's per-shape work are done before
// the model reports ready. A model that fails on them fails with its own error first, then the
// inputs it was given.
void Batcher::warm_up(const Runner& runner) {
  std::unique_lock<std::mutex> one_at_a_time;
  if (warm_up_lock_) one_at_a_time = std::unique_lock<std::mutex>(*warm_up_lock_);
  for (int64_t samples = 1; samples <= config_.max_batch_size; ++samples) {
    std::vector<at::Tensor> inputs;
    std::vector<std::string> described;
    for (const auto& spec : config_.inputs) {
      std::vector<int64_t> shape{samples};
      for (int64_t dim : spec.dims) shape.push_back(dim == -1 ? 1 : dim);
      inputs.push_back(at::zeros(shape, at::TensorOptions().dtype(scalar_type(spec.datatype))));
      described.push_back(fmt::format("'{}' {} [{}]", spec.name, datatype_name(spec.datatype), fmt::join(shape, ", ")));
    }
    std::vector<at::Tensor> outputs;
    try {
      outputs = runner(inputs);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} (on zeros shaped as the config's inputs: {})", first_line(e),
                              fmt::join(described, ", ")));
    }
    check_outputs(config_, outputs, samples);
  }
}

std::vector<Batcher::Pending> Batcher::next_batch(std::unique_lock<std::mutex>& lock) {
  for (;;) {
    fail_expired(lock);
    if (queue_.empty()) {
      if (stopping_) return {};
      changed_.wait(lock);
      continue;
    }
    const Clock::time_point oldest = queue_.front().arrival;
    const Clock::time_point delay_end = oldest + std::chrono::microseconds(config_.max_queue_delay_us);
    const bool deadline_passed = stopping_ || !config_.dynamic_batching || Clock::now() >= delay_end;
    if (std::size_t count = ready_prefix(deadline_passed)) {
      std::vector<Pending> batch(std::make_move_iterator(queue_.begin()),
                                 std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(count)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(count));
      return batch;
    }
    changed_.wait_until(lock, std::min(delay_end, oldest + std::chrono::microseconds(config_.timeout_us)));
  }
}

// How many requests from the queue's front to run now (0: wait for more).
std::size_t Batcher::ready_prefix(bool deadline_passed) const {
  if (!config_.dynamic_batching) return 1;
  int64_t samples = 0;
  std::size_t count = 0;
  std::size_t preferred_count = 0;
  for (const auto& pending : queue_) {
    if (samples + pending.samples > config_.max_batch_size) return count;  // full
    samples += pending.samples;
    ++count;
    const auto& preferred = config_.preferred_batch_sizes;
    if (std::binary_search(preferred.begin(), preferred.end(), samples)) preferred_count = count;
  }
  if (samples == config_.max_batch_size || deadline_passed) return count;
  return preferred_count;
}

void Batcher::fail_expired(std::unique_lock<std::mutex>& lock) {
  // Every request has the same timeout, so the queue is in expiry order.
  const Clock::time_point now = Clock::now();
  std::vector<Pending> expired;
  while (!queue_.empty() && now - queue_.front().arrival >= std::chrono::microseconds(config_.timeout_us)) {
    expired.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  if (expired.empty()) return;
  lock.unlock();
  for (auto& pending : expired) {
    metrics_.pending_requests -= 1;
    pending.done({504, fmt::format("model '{}': timed out after {} us in the queue", config_.name,
                                   microseconds(now - pending.arrival)), {}});
  }
  lock.lock();
}

void Batcher::run_batch(const Runner& runner, std::vector<Pending> batch) {
  const Clock::time_point start = Clock::now();
  int64_t samples = 0;
  int64_t queued_us = 0;
  std::vector<std::vector<at::Tensor>*> inputs;
  for (auto& pending : batch) {
    samples += pending.samples;
    queued_us += microseconds(start - pending.arrival);
    inputs.push_back(&pending.inputs);
  }
  std::vector<BatchResult> results(batch.size());
  try {
    std::vector<at::Tensor> outputs = runner(concat_inputs(inputs));
    check_outputs(config_, outputs, samples);
    int64_t offset = 0;
    for (std::size_t r = 0; r < batch.size(); ++r) {
      for (const auto& output : outputs) results[r].outputs.push_back(output.narrow(0, offset, batch[r].samples));
      offset += batch[r].samples;
    }
  } catch (const std::exception& e) {
    for (auto& result : results) result = {500, fmt::format("model '{}': {}", config_.name, first_line(e)), {}};
  }
  metrics_.queue_duration_us += queued_us;
  metrics_.compute_duration_us += microseconds(Clock::now() - start);
  metrics_.execution_count += 1;
  metrics_.inference_count += samples;
  metrics_.batch_size.observe(static_cast<uint64_t>(samples));
  for (std::size_t r = 0; r < batch.size(); ++r) {
    metrics_.pending_requests -= 1;
    batch[r].done(std::move(results[r]));
  }
}

}  // namespace afterburner::serve
