// Throughput and latency of a TorchScript model at several batch sizes, each within a time
// budget.
//
//   namespace infer = afterburner::infer;
//   auto speed = infer::measure(model, {1, 28, 28}, infer::MeasureOptions().batch_sizes({1, 64}));
//   for (const auto& point : speed.points) std::cout << infer::describe(point) << "\n";
//   speed.best().batch_size;   // the batch size with the highest samples/s
//
//   // Several or non-float inputs: batches cut from example rows, one tensor per forward argument.
//   // Each batch size's point is passed on as soon as it is measured (a large model takes long).
//   auto speed2 = infer::measure_inputs(model, {images, token_ids},
//                                       infer::MeasureOptions().batch_sizes({1, 64}).seconds_per_batch_size(1).on_measured(
//                                           [](const infer::SpeedPoint& p) { std::cout << infer::describe(p) << "\n"; }));
#pragma once

#include <torch/arg.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace afterburner::infer {

struct SpeedPoint {
  int64_t batch_size = 0;
  double samples_per_second = 0;  // batch_size / median call latency
  double p50_ms = 0;              // per-call latency percentiles
  double p99_ms = 0;
  int calls = 0;                  // timed
  int warmup_calls = 0;           // before them, not timed
  double seconds = 0;             // wall time of all of them
};

// The budget covers a batch size's warm-up and timed calls alike, so that a model whose one call
// takes seconds (ResNet-18 at 224x224, batch 256) is not called a fixed number of times whatever
// the budget says. The first warm-up call runs whatever the budget (lazy initialisation, oneDNN
// primitive creation, the first touch of the activations' memory would otherwise be timed);
// further ones, up to warmup_calls, only while the warm-up has used under a quarter of the budget. Then calls are
// timed until the budget is spent, at least one: a batch size whose single call outlasts the
// budget takes two calls in all.
struct MeasureOptions {
  TORCH_ARG(std::vector<int64_t>, batch_sizes) = std::vector<int64_t>{1, 16, 64, 256};
  TORCH_ARG(int, warmup_calls) = 3;
  TORCH_ARG(double, seconds_per_batch_size) = 0.3;
  // Called with each batch size's point as soon as it is measured, before the next batch size.
  TORCH_ARG(std::function<void(const SpeedPoint&)>, on_measured) = nullptr;
};

struct Speed {
  std::vector<SpeedPoint> points;  // in the order of MeasureOptions::batch_sizes
  const SpeedPoint& best() const;  // highest samples/s; throws Error if there are no points
};

// "batch 64: 21034 samples/s, latency p50 3.04 ms, p99 3.90 ms (98 calls timed)"
std::string describe(const SpeedPoint& point);

// Throws UsageError("batch_sizes", ...) for an empty list or a size < 1: what measure and
// measure_inputs check first, for a caller to check before the work that precedes measuring.
void check_measure_options(const MeasureOptions& options);

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
