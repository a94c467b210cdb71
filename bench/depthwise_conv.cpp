// The backward of depthwise convolutions, afterburner's (kernels::conv2d_backward: LibTorch's input
// gradient, our weight and bias gradients) against LibTorch's at::convolution_backward (oneDNN),
// on the depthwise layers of MobileNetV3-Small and EfficientNet-B0 at 28 px (batch 128, the
// training benchmark's Fashion-MNIST) and at 224 px (batch 32), channels_last, fp32 and bf16. The
// two run alternately, one call each per repetition; median [min, max] in ms and the ratio of the
// medians.
//
//   build/bench/bench_depthwise_conv [repetitions=20] [threads=2]
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "afterburner/core/threads.h"
#include "afterburner/kernels/conv2d.h"

namespace {

struct Layer {
  const char* model;
  int64_t batch, channels, size, kernel, stride;
};

// Each distinct depthwise layer (channels, input size, filter, stride) of the two models.
const std::vector<Layer> kLayers{
    {"MobileNetV3-S 28px", 128, 16, 14, 3, 2},    {"MobileNetV3-S 28px", 128, 72, 7, 3, 2},
    {"MobileNetV3-S 28px", 128, 88, 4, 3, 1},     {"MobileNetV3-S 28px", 128, 96, 4, 5, 2},
    {"MobileNetV3-S 28px", 128, 240, 2, 5, 1},    {"MobileNetV3-S 28px", 128, 120, 2, 5, 1},
    {"MobileNetV3-S 28px", 128, 288, 2, 5, 2},    {"MobileNetV3-S 28px", 128, 576, 1, 5, 1},
    {"EfficientNet-B0 28px", 128, 32, 14, 3, 1},  {"EfficientNet-B0 28px", 128, 144, 7, 5, 2},
    {"EfficientNet-B0 28px", 128, 240, 4, 5, 1},  {"EfficientNet-B0 28px", 128, 672, 2, 5, 1},
    {"EfficientNet-B0 28px", 128, 1152, 1, 5, 1}, {"EfficientNet-B0 224px", 32, 32, 112, 3, 1},
    {"EfficientNet-B0 224px", 32, 96, 112, 3, 2}, {"EfficientNet-B0 224px", 32, 144, 56, 5, 2},
    {"EfficientNet-B0 224px", 32, 240, 28, 5, 1}, {"EfficientNet-B0 224px", 32, 672, 14, 5, 1},
    {"EfficientNet-B0 224px", 32, 1152, 7, 5, 1}};

struct Timing {
  double median_ms, min_ms, max_ms;
};

Timing summary(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples.front(), samples.back()};
}

double time_ms(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::string cell(const Timing& t) { return fmt::format("{:8.3f} [{:.3f}, {:.3f}]", t.median_ms, t.min_ms, t.max_ms); }

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 20;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  afterburner::ThreadsGuard thread_count(threads);
  const torch::NoGradGuard no_grad;  // as the autograd engine runs a backward (no create_graph)
  fmt::print("depthwise conv2d backward (x, weight and bias gradients), channels_last, {} threads, {} repetitions\n",
             threads, repetitions);
  fmt::print("{:<22} {:>5} {:>5} {:>4} {:>3} {:>2} {:>5} | {:>28} | {:>28} | {:>6}\n", "layer", "batch", "chan",
             "px", "k", "s", "dtype", "LibTorch ms", "afterburner ms", "ratio");
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const Layer& l : kLayers) {
      torch::manual_seed(0);
      const auto opts = torch::dtype(dtype);
      const auto x =
          torch::randn({l.batch, l.channels, l.size, l.size}, opts).contiguous(at::MemoryFormat::ChannelsLast);
      const auto w = torch::randn({l.channels, 1, l.kernel, l.kernel}, opts);
      const std::vector<int64_t> stride{l.stride, l.stride}, padding{l.kernel / 2, l.kernel / 2}, dilation{1, 1};
      const auto grad_y =
          torch::randn_like(torch::conv2d(x, w, {}, stride, padding, dilation, l.channels));
      const std::vector<int64_t> bias{l.channels};
      const auto libtorch = [&] {
        at::convolution_backward(grad_y, x, w, c10::IntArrayRef(bias), stride, padding, dilation, false, {0, 0},
                                 l.channels, {true, true, true});
      };
      const auto ours = [&] {
        afterburner::kernels::conv2d_backward(grad_y, x, w, true, stride, padding, dilation, l.channels,
                                              {true, true, true});
      };
      libtorch();  // warm-up: oneDNN's primitive creation, first-touch allocations
      ours();
      std::vector<double> theirs_ms, ours_ms;
      for (int r = 0; r < repetitions; ++r) {
        theirs_ms.push_back(time_ms(libtorch));
        ours_ms.push_back(time_ms(ours));
      }
      const Timing a = summary(theirs_ms), b = summary(ours_ms);
      fmt::print("{:<22} {:>5} {:>5} {:>4} {:>3} {:>2} {:>5} | {} | {} | {:5.1f}x\n", l.model, l.batch, l.channels,
                 l.size, l.kernel, l.stride, dtype == torch::kFloat ? "fp32" : "bf16", cell(a), cell(b),
                 a.median_ms / b.median_ms);
    }
  }
}
