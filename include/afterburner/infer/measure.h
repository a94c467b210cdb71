// Throughput and latency of a TorchScript model at several batch sizes.
//
//   namespace infer = afterburner::infer;
//   auto speed = infer::measure(model, {1, 28, 28}, infer::MeasureOptions().batch_sizes({1, 64}));
//   for (const auto& point : speed.points) std::cout << infer::describe(point) << "\n";
//   speed.best().batch_size;   // the batch size with the highest samples/s
//
//   // Several or non-float inputs: batches cut from example rows, one tensor per forward argument.
//   auto speed2 = infer::measure_inputs(model, {images, token_ids}, infer::MeasureOptions().batch_sizes({1, 64}));
#pragma once

#include <torch/arg.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace afterburner::infer {

struct MeasureOptions {
  TORCH_ARG(std::vector<int64_t>, batch_sizes) = std::vector<int64_t>{1, 16, 64, 256};
  TORCH_ARG(int, warmup_calls) = 3;        // not timed: lazy init, oneDNN primitive creation
  TORCH_ARG(double, seconds_per_batch_size) = 0.3;
  TORCH_ARG(int, min_calls) = 5;
};

struct SpeedPoint {
  int64_t batch_size = 0;
  double samples_per_second = 0;  // batch_size / median call latency
  double p50_ms = 0;              // per-call latency percentiles
  double p99_ms = 0;
  int calls = 0;
};

struct Speed {
  std::vector<SpeedPoint> points;  // in the order of MeasureOptions::batch_sizes
  const SpeedPoint& best() const;  // highest samples/s; throws Error if there are no points
};

// "batch 64: 21034 samples/s, latency p50 3.04 ms, p99 3.90 ms (98 calls)"
std::string describe(const SpeedPoint& point);

// Feeds random float32 inputs of shape [batch, sample_shape...] under inference mode, on the
// calling thread's intra-op thread count. Throws UsageError("batch_sizes", ...) for an empty
// list or a size < 1.
Speed measure(torch::jit::Module& model, const std::vector<int64_t>& sample_shape,
              const MeasureOptions& options = {});

// Likewise with inputs cut from `examples`: one tensor per forward argument, [N, ...] each,
// rows 0..B-1 for batch size B (repeated from the first when B > N). Throws UsageError
// ("examples", ...) for no tensors, or tensors without a common number of rows (at least 1).
Speed measure_inputs(torch::jit::Module& model, const std::vector<torch::Tensor>& examples,
                     const MeasureOptions& options = {});

}  // namespace afterburner::infer
