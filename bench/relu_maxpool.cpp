// Fused relu_max_pool2d against torch's relu -> max_pool2d on the two pooling shapes of the `cnn`
// model, fp32 and bf16, NCHW and channels_last: forward (with grad recording, as in training) and
// forward+backward, median [min, max] over the repetitions.
//
//   build-*/bench/bench_relu_maxpool [repetitions=50] [threads=2]
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "afterburner/core/threads.h"
#include "afterburner/kernels/relu_maxpool.h"

namespace {

struct Timing {
  double median_ms, min_ms, max_ms;
};

Timing time_ms(int repetitions, const std::function<void()>& run) {
  run();  // warm-up: first-touch allocations and thread pool start
  std::vector<double> samples;
  for (int i = 0; i < repetitions; ++i) {
    auto start = std::chrono::steady_clock::now();
    run();
    samples.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples.front(), samples.back()};
}

using Pool = std::function<torch::Tensor(const torch::Tensor&)>;

torch::Tensor torch_pool(const torch::Tensor& x) { return torch::max_pool2d(torch::relu(x), 2, 2); }
torch::Tensor fused_pool(const torch::Tensor& x) { return afterburner::kernels::relu_max_pool2d(x, 2, 2); }

struct Measured {
  Timing forward, forward_backward;
};

Measured measure(const Pool& pool, const torch::Tensor& x, const torch::Tensor& grad_out, int repetitions) {
  Measured m;
  m.forward = time_ms(repetitions, [&] { pool(x); });
  m.forward_backward = time_ms(repetitions, [&] { torch::autograd::grad({pool(x)}, {x}, {grad_out}); });
  return m;
}

std::string cell(const Timing& t) { return fmt::format("{:7.3f} [{:.3f}, {:.3f}]", t.median_ms, t.min_ms, t.max_ms); }

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 50;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  afterburner::ThreadsGuard thread_count(threads);
  torch::manual_seed(0);

  fmt::print("relu -> max_pool2d(2, 2): torch vs fused, {} threads, {} repetitions, ms median [min, max]\n",
             at::get_num_threads(), repetitions);
  fmt::print("{:<18} {:<5} {:<13} {:>26} {:>26} {:>6} {:>26} {:>26} {:>6} {:>5}\n", "input", "dtype", "layout",
             "torch fwd", "fused fwd", "ratio", "torch fwd+bwd", "fused fwd+bwd", "ratio", "same");
  const std::vector<std::vector<int64_t>> shapes{{128, 32, 28, 28}, {128, 64, 14, 14}};
  for (const auto& shape : shapes) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
        auto x = torch::randn(shape).to(dtype).contiguous(format).requires_grad_(true);
        auto grad_out = torch::randn({shape[0], shape[1], shape[2] / 2, shape[3] / 2}).to(dtype).contiguous(format);
        const bool same = torch::equal(torch_pool(x), fused_pool(x)) &&
                          torch::equal(torch::autograd::grad({torch_pool(x)}, {x}, {grad_out})[0],
                                       torch::autograd::grad({fused_pool(x)}, {x}, {grad_out})[0]);
        auto reference = measure(torch_pool, x, grad_out, repetitions);
        auto fused = measure(fused_pool, x, grad_out, repetitions);
        fmt::print("{:<18} {:<5} {:<13} {:>26} {:>26} {:>5.1f}x {:>26} {:>26} {:>5.1f}x {:>5}\n",
                   fmt::format("{}x{}x{}x{}", shape[0], shape[1], shape[2], shape[3]),
                   dtype == torch::kFloat ? "fp32" : "bf16",
                   format == at::MemoryFormat::Contiguous ? "NCHW" : "channels_last", cell(reference.forward),
                   cell(fused.forward), reference.forward.median_ms / fused.forward.median_ms,
                   cell(reference.forward_backward), cell(fused.forward_backward),
                   reference.forward_backward.median_ms / fused.forward_backward.median_ms, same ? "yes" : "NO");
      }
    }
  }
}
