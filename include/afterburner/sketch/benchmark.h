// Speed, size and FLOPs of SKLinear against the torch::nn::Linear it replaces, for one
// configuration or a landscape of (terms L, rank k), as JSON, CSV and an SVG heatmap.
//
//   namespace sketch = afterburner::sketch;
//   auto result = sketch::benchmark_sklinear(sketch::BenchmarkOptions(8192, 8192).terms(1).rank(16).batch(64));
//   std::cout << sketch::to_json(result).dump(2) << "\n";   // result.forward_speedup() ...
//
//   auto landscape = sketch::benchmark_landscape(sketch::BenchmarkOptions(4096, 4096), {1, 2, 4}, {8, 16, 32, 64});
//   sketch::write_csv(landscape, "landscape.csv");
//   sketch::write_svg(landscape, "landscape.svg");        // forward speedup over L x k
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "afterburner/profile/alternate.h"

namespace afterburner::sketch {

struct BenchmarkOptions {
  BenchmarkOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(int64_t, terms) = 1;  // L
  TORCH_ARG(int64_t, rank) = 16;  // k
  TORCH_ARG(int64_t, batch) = 64;
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat;  // kFloat or kBFloat16: both layers run in it
  TORCH_ARG(int, reps) = 20;                       // timed repetitions of each step
  TORCH_ARG(int, warmup) = 3;                      // untimed ones first: page faults, lazy initialisation
};

using profile::Milliseconds;  // median, min, max

struct LayerFigures {
  int64_t params = 0;             // trained elements: weight (or S1s, S2s) and bias
  int64_t buffers = 0;            // fixed elements saved with the layer: SKLinear's signs U1s, U2s
  int64_t bytes = 0;              // storage of both in the benchmark's dtype
  int64_t forward_flops = 0;      // multiply-adds counted as 2
  Milliseconds forward;           // under torch::NoGradGuard, as inference runs it
  Milliseconds forward_backward;  // gradients of the input and of every parameter
  // Peak bytes of tensors a forward+backward step allocates (output, saved activations,
  // gradients) beyond what it starts with; 0 unless profile::TensorMemory is installed.
  int64_t step_peak_bytes = 0;
};

struct BenchmarkResult {
  BenchmarkOptions options{1, 1};
  int threads = 0;  // at::get_num_threads() while measuring
  LayerFigures dense, sketched;

  // Ratios dense / sketched: above 1, the sketched layer is faster or smaller. param_ratio
  // compares trained elements; with the signs, SKLinear stores 2Lk(d_in + d_out) + d_out.
  double forward_speedup() const { return dense.forward.median / sketched.forward.median; }
  double forward_backward_speedup() const { return dense.forward_backward.median / sketched.forward_backward.median; }
  double flop_ratio() const;
  double param_ratio() const;
};

// Times the dense and the sketched layer alternately on one random [batch, in_features] input,
// so that both see the same machine noise; the times are medians of `reps` repetitions after
// `warmup` ones. With profile::TensorMemory installed, also each layer's step_peak_bytes.
// Throws UsageError naming the option for sizes or counts below 1 or another dtype.
BenchmarkResult benchmark_sklinear(const BenchmarkOptions& options);

// One benchmark per (L, k) of terms_list x ranks (each sorted, duplicates dropped), L outer;
// `options` gives everything else. `on_result` sees each result as it is measured.
std::vector<BenchmarkResult> benchmark_landscape(const BenchmarkOptions& options, std::vector<int64_t> terms_list,
                                                 std::vector<int64_t> ranks,
                                                 const std::function<void(const BenchmarkResult&)>& on_result = {});

// "fp32" or "bf16".
std::string dtype_name(torch::Dtype dtype);

// {"in", "out", "terms", "rank", "batch", "dtype", "threads", "reps", "dense": {"params", "buffers",
// "bytes", "forward_flops", "forward_ms": {"median", "min", "max"}, "forward_backward_ms": {...},
// "step_peak_bytes"},
// "sketched": {...}, "forward_speedup", "forward_backward_speedup", "flop_ratio", "param_ratio"}
nlohmann::json to_json(const BenchmarkResult& result);

// A header line, then one line per result.
void write_csv(const std::vector<BenchmarkResult>& results, std::ostream& out);
// A heatmap of the forward speedup over terms (rows) x ranks (columns), one cell per result,
// each labelled with its forward and forward+backward speedups. Throws UsageError for no results.
void write_svg(const std::vector<BenchmarkResult>& results, std::ostream& out);
// The same into files; throw Error naming the file when it cannot be written.
void write_csv(const std::vector<BenchmarkResult>& results, const std::string& path);
void write_svg(const std::vector<BenchmarkResult>& results, const std::string& path);

}  // namespace afterburner::sketch
