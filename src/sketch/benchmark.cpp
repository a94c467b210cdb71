#include "afterburner/sketch/benchmark.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/profile/alternate.h"
#include "afterburner/profile/memory.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::sketch {
namespace {

void check_options(const BenchmarkOptions& o) {
  for (auto [name, value] : {std::pair<const char*, int64_t>{"in_features", o.in_features()},
                             {"out_features", o.out_features()},
                             {"terms", o.terms()},
                             {"rank", o.rank()},
                             {"batch", o.batch()},
                             {"reps", o.reps()}}) {
    if (value < 1)
      throw UsageError(std::string("benchmark ") + name, "must be at least 1, got " + std::to_string(value));
  }
  if (o.warmup() < 0) throw UsageError("benchmark warmup", "must be at least 0, got " + std::to_string(o.warmup()));
  if (o.dtype() != torch::kFloat && o.dtype() != torch::kBFloat16) {
    throw UsageError("benchmark dtype", std::string("expected fp32 or bf16, got ") + c10::toString(o.dtype()));
  }
}

// A layer as the timing sees it: its forward and the parameters its backward differentiates.
struct Layer {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<torch::Tensor> parameters;
};

template <typename Module>
Layer as_layer(Module& module) {
  return {[impl = module.ptr()](const torch::Tensor& x) { return impl->forward(x); }, module->parameters()};
}

template <typename Module>
LayerFigures sizes_of(const Module& module) {
  LayerFigures figures;
  for (const auto& p : module->parameters()) {
    figures.params += p.numel();
    figures.bytes += static_cast<int64_t>(p.nbytes());
  }
  for (const auto& b : module->buffers()) {
    figures.buffers += b.numel();
    figures.bytes += static_cast<int64_t>(b.nbytes());
  }
  return figures;
}

std::function<void()> forward_step(const Layer& layer, const torch::Tensor& input) {
  return [&layer, &input] {
    torch::NoGradGuard no_grad;
    layer.forward(input);
  };
}

// The gradients a training step needs: of the input (for the layers below) and of every
// parameter, for a fixed upstream gradient.
std::function<void()> forward_backward_step(const Layer& layer, const torch::Tensor& input,
                                            const torch::Tensor& upstream) {
  return [&layer, &input, &upstream] {
    std::vector<torch::Tensor> wrt{input};
    wrt.insert(wrt.end(), layer.parameters.begin(), layer.parameters.end());
    torch::autograd::grad({layer.forward(input)}, wrt, {upstream});
  };
}

int64_t step_peak_bytes(const std::function<void()>& step) {
  if (!profile::TensorMemory::installed()) return 0;
  const int64_t before = profile::TensorMemory::current_bytes();
  profile::TensorMemory::reset_peak();
  step();
  return profile::TensorMemory::peak_bytes() - before;
}

nlohmann::json to_json(const Milliseconds& ms) { return {{"median", ms.median}, {"min", ms.min}, {"max", ms.max}}; }

nlohmann::json to_json(const LayerFigures& figures) {
  return {{"params", figures.params},
          {"buffers", figures.buffers},
          {"bytes", figures.bytes},
          {"forward_flops", figures.forward_flops},
          {"forward_ms", to_json(figures.forward)},
          {"forward_backward_ms", to_json(figures.forward_backward)},
          {"step_peak_bytes", figures.step_peak_bytes}};
}

std::vector<int64_t> sorted_unique(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

// Red below 1x, yellow at 1x, green from 4x: the hue follows log2 of the speedup.
std::string speedup_colour(double speedup) {
  const double hue = std::clamp(60.0 + 30.0 * std::log2(speedup), 0.0, 120.0);
  return fmt::format("hsl({:.0f},70%,65%)", hue);
}

}  // namespace

double BenchmarkResult::flop_ratio() const {
  return static_cast<double>(dense.forward_flops) / static_cast<double>(sketched.forward_flops);
}

double BenchmarkResult::param_ratio() const {
  return static_cast<double>(dense.params) / static_cast<double>(sketched.params);
}

std::string dtype_name(torch::Dtype dtype) {
  if (dtype == torch::kFloat) return "fp32";
  if (dtype == torch::kBFloat16) return "bf16";
  return c10::toString(dtype);
}

BenchmarkResult benchmark_sklinear(const BenchmarkOptions& options) {
  check_options(options);
  const int64_t in = options.in_features(), out = options.out_features(), batch = options.batch();
  torch::nn::Linear dense(in, out);
  SKLinear sketched(SKLinearOptions(in, out).terms(options.terms()).rank(options.rank()));
  dense->to(options.dtype());
  sketched->to(options.dtype());

  BenchmarkResult result;
  result.options = options;
  result.threads = at::get_num_threads();
  result.dense = sizes_of(dense);
  result.sketched = sizes_of(sketched);
  result.dense.forward_flops = 2 * batch * in * out;
  result.sketched.forward_flops = 2 * batch * 2 * options.terms() * options.rank() * (in + out);

  const Layer dense_layer = as_layer(dense), sketched_layer = as_layer(sketched);
  const torch::Tensor input = torch::randn({batch, in}).to(options.dtype()).requires_grad_();
  const torch::Tensor upstream = torch::randn({batch, out}).to(options.dtype());
  std::tie(result.dense.forward, result.sketched.forward) =
      profile::time_alternately(forward_step(dense_layer, input), forward_step(sketched_layer, input), options.reps(),
                                options.warmup());
  std::tie(result.dense.forward_backward, result.sketched.forward_backward) =
      profile::time_alternately(forward_backward_step(dense_layer, input, upstream),
                                forward_backward_step(sketched_layer, input, upstream), options.reps(), options.warmup());
  result.dense.step_peak_bytes = step_peak_bytes(forward_backward_step(dense_layer, input, upstream));
  result.sketched.step_peak_bytes = step_peak_bytes(forward_backward_step(sketched_layer, input, upstream));
  return result;
}

std::vector<BenchmarkResult> benchmark_landscape(const BenchmarkOptions& options, std::vector<int64_t> terms_list,
                                                 std::vector<int64_t> ranks,
                                                 const std::function<void(const BenchmarkResult&)>& on_result) {
  if (terms_list.empty()) throw UsageError("benchmark terms_list", "is empty");
  if (ranks.empty()) throw UsageError("benchmark ranks", "is empty");
  std::vector<BenchmarkResult> results;
  for (int64_t terms : sorted_unique(std::move(terms_list))) {
    for (int64_t rank : sorted_unique(ranks)) {
      results.push_back(benchmark_sklinear(BenchmarkOptions(options).terms(terms).rank(rank)));
      if (on_result) on_result(results.back());
    }
  }
  return results;
}

nlohmann::json to_json(const BenchmarkResult& result) {
  const BenchmarkOptions& o = result.options;
  return {{"in", o.in_features()},
          {"out", o.out_features()},
          {"terms", o.terms()},
          {"rank", o.rank()},
          {"batch", o.batch()},
          {"dtype", dtype_name(o.dtype())},
          {"threads", result.threads},
          {"reps", o.reps()},
          {"dense", to_json(result.dense)},
          {"sketched", to_json(result.sketched)},
          {"forward_speedup", result.forward_speedup()},
          {"forward_backward_speedup", result.forward_backward_speedup()},
          {"flop_ratio", result.flop_ratio()},
          {"param_ratio", result.param_ratio()}};
}

void write_csv(const std::vector<BenchmarkResult>& results, std::ostream& out) {
  out << "in,out,batch,terms,rank,dtype,threads,reps,dense_params,sketched_params,sketched_buffers,param_ratio,"
         "flop_ratio,"
         "dense_forward_ms,sketched_forward_ms,forward_speedup,"
         "dense_forward_backward_ms,sketched_forward_backward_ms,forward_backward_speedup\n";
  for (const auto& r : results) {
    const BenchmarkOptions& o = r.options;
    out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}\n",
                       o.in_features(), o.out_features(), o.batch(), o.terms(), o.rank(), dtype_name(o.dtype()),
                       r.threads, o.reps(), r.dense.params, r.sketched.params, r.sketched.buffers, r.param_ratio(),
                       r.flop_ratio(), r.dense.forward.median, r.sketched.forward.median, r.forward_speedup(),
                       r.dense.forward_backward.median, r.sketched.forward_backward.median,
                       r.forward_backward_speedup());
  }
}

void write_svg(const std::vector<BenchmarkResult>& results, std::ostream& out) {
  if (results.empty()) throw UsageError("benchmark results", "nothing to plot");
  std::vector<int64_t> terms_list, ranks;
  for (const auto& r : results) {
    terms_list.push_back(r.options.terms());
    ranks.push_back(r.options.rank());
  }
  terms_list = sorted_unique(terms_list);
  ranks = sorted_unique(ranks);
  const auto index_of = [](const std::vector<int64_t>& values, int64_t value) {
    return static_cast<int>(std::lower_bound(values.begin(), values.end(), value) - values.begin());
  };

  constexpr int left = 110, top = 70, cell_width = 120, cell_height = 64, bottom = 90;
  const int width = std::max(640, left + static_cast<int>(ranks.size()) * cell_width + 20);
  const int height = top + static_cast<int>(terms_list.size()) * cell_height + bottom;
  const int grid_bottom = height - bottom;
  const BenchmarkOptions& o = results.front().options;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << fmt::format(
             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
             "font-family=\"sans-serif\" font-size=\"13\">\n",
             width, height)
      << "<text x=\"10\" y=\"24\" font-size=\"15\">SKLinear vs torch::nn::Linear: forward speedup</text>\n"
      << fmt::format("<text x=\"10\" y=\"44\">{} -&gt; {}, batch {}, {}, {} threads, median of {} reps</text>\n",
                     o.in_features(), o.out_features(), o.batch(), dtype_name(o.dtype()), results.front().threads,
                     o.reps());
  for (const auto& r : results) {
    const int x = left + index_of(ranks, r.options.rank()) * cell_width;
    const int y = top + index_of(terms_list, r.options.terms()) * cell_height;
    out << fmt::format(
               "<rect class=\"cell\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"white\"/>\n", x,
               y, cell_width, cell_height, speedup_colour(r.forward_speedup()))
        << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"17\">{:.1f}x</text>\n",
                       x + cell_width / 2, y + 28, r.forward_speedup())
        << fmt::format(
               "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\">f+b {:.1f}x, FLOPs {:.0f}x</text>\n",
               x + cell_width / 2, y + 48, r.forward_backward_speedup(), r.flop_ratio());
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    out << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       left + static_cast<int>(i) * cell_width + cell_width / 2, grid_bottom + 18, ranks[i]);
  }
  for (size_t i = 0; i < terms_list.size(); ++i) {
    out << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 10,
                       top + static_cast<int>(i) * cell_height + cell_height / 2 + 5, terms_list[i]);
  }
  out << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">rank k</text>\n",
                     left + static_cast<int>(ranks.size()) * cell_width / 2, grid_bottom + 40)
      << fmt::format(
             "<text x=\"30\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 30 {0})\">terms L</text>\n",
             top + static_cast<int>(terms_list.size()) * cell_height / 2)
      << fmt::format(
             "<text x=\"10\" y=\"{}\" font-size=\"11\">cell: forward speedup (dense median / sketched median); "
             "f+b: forward+backward; FLOPs: dense / sketched</text>\n",
             grid_bottom + 70)
      << "</svg>\n";
}

void write_csv(const std::vector<BenchmarkResult>& results, const std::string& path) {
  std::ostringstream text;
  write_csv(results, text);
  write_file_atomically(path, text.str());
}

void write_svg(const std::vector<BenchmarkResult>& results, const std::string& path) {
  std::ostringstream text;
  write_svg(results, text);  // before opening the file: no empty file for an empty landscape
  write_file_atomically(path, text.str());
}

}  // namespace afterburner::sketch
