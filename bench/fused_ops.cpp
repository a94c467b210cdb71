// Forward+backward time of the fused kernels against the torch ops they replace, at the zoo's
// shapes: linear_relu vs torch::relu(torch::linear(...)) for the cnn's fc1 (batch 128,
// 3136->128) and the mlp's hidden layers (batch 256, 784->1024 and 1024->1024); Conv2dReLU vs
// Conv2d then ReLU for the cnn's two convolutions (batch 128); cross_entropy vs
// torch::nn::functional::cross_entropy for batch 128 and 256 with 10 and 1000 classes. Each in
// fp32 and under bf16 autocast (entered and left every step, as training does), with freed
// memory kept in the heap as `afterburner train` keeps it.
//
//   bench_fused_ops [--reps N] [--threads N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "afterburner/core/blas.h"
#include "afterburner/core/error.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/threads.h"
#include "afterburner/kernels/conv_relu.h"
#include "afterburner/kernels/cross_entropy.h"
#include "afterburner/kernels/linear_relu.h"
#include "afterburner/profile/alternate.h"
#include "afterburner/train/precision.h"

namespace {

using afterburner::train::Precision;

struct Settings {
  int reps = 50;
  int threads = 2;
};

Settings parse(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--reps") {
      settings.reps = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--threads") {
      settings.threads = std::max(1, std::atoi(value.c_str()));
    } else {
      throw afterburner::UsageError(flag, "unknown flag (use --reps, --threads)");
    }
  }
  return settings;
}

// Times the two steps alternately, so that both see the same machine noise, after a warm-up.
void compare(const std::string& label, const std::function<void()>& fused, const std::function<void()>& torch_ops,
             int reps) {
  const auto [f, t] = afterburner::profile::time_alternately(fused, torch_ops, reps);
  std::printf("%-44s fused %8.3f ms [%7.3f, %8.3f]  torch %8.3f ms [%7.3f, %8.3f]  torch/fused %.2fx\n", label.c_str(),
              f.median, f.min, f.max, t.median, t.min, t.max, t.median / f.median);
}

using Forward = std::function<torch::Tensor()>;

// One training step's worth of work on `inputs`: the forward (under autocast for bf16), then the
// gradients of all inputs for a fixed upstream gradient.
std::function<void()> forward_backward(const Forward& forward, const std::vector<torch::Tensor>& inputs,
                                       Precision precision) {
  return [=] {
    torch::Tensor output;
    {
      afterburner::train::AutocastGuard autocast(precision);
      output = forward();
    }
    torch::autograd::grad({output}, inputs, {torch::ones_like(output)});
  };
}

struct LinearShape {
  std::string name;
  int64_t batch, in, out;
  bool input_requires_grad;  // false for a model's first layer
};

void bench_linear(const LinearShape& shape, Precision precision, int reps) {
  torch::nn::Linear linear(shape.in, shape.out);
  const torch::Tensor x = torch::randn({shape.batch, shape.in}).requires_grad_(shape.input_requires_grad);
  std::vector<torch::Tensor> inputs{linear->weight, linear->bias};
  if (shape.input_requires_grad) inputs.push_back(x);
  const Forward fused = [=] { return afterburner::kernels::linear_relu(x, linear->weight, linear->bias); };
  const Forward torch_ops = [=] { return torch::relu(torch::linear(x, linear->weight, linear->bias)); };
  const std::string label = "linear_relu " + shape.name + " " + afterburner::train::to_string(precision);
  compare(label, forward_backward(fused, inputs, precision), forward_backward(torch_ops, inputs, precision), reps);
}

struct ConvShape {
  std::string name;
  int64_t batch, in_channels, out_channels, size;
  bool input_requires_grad;  // false for a model's first layer
};

void bench_conv_relu(const ConvShape& shape, Precision precision, int reps) {
  namespace kernels = afterburner::kernels;
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(shape.in_channels, shape.out_channels, 3).padding(1));
  kernels::Conv2dReLU fused_conv = kernels::Conv2dReLUImpl::from_conv(conv);
  const torch::Tensor x =
      torch::randn({shape.batch, shape.in_channels, shape.size, shape.size}).requires_grad_(shape.input_requires_grad);
  std::vector<torch::Tensor> inputs{conv->weight, conv->bias};
  if (shape.input_requires_grad) inputs.push_back(x);
  const Forward fused = [=]() mutable { return fused_conv->forward(x); };
  const Forward torch_ops = [=]() mutable { return torch::relu(conv->forward(x)); };
  const std::string label = "conv_relu " + shape.name + " " + afterburner::train::to_string(precision);
  compare(label, forward_backward(fused, inputs, precision), forward_backward(torch_ops, inputs, precision), reps);
}

void bench_cross_entropy(int64_t batch, int64_t classes, Precision precision, int reps) {
  // Logits as the model hands them over: bf16 when its last layer ran under autocast.
  const auto dtype = precision == Precision::bf16 ? torch::kBFloat16 : torch::kFloat;
  const torch::Tensor logits = torch::randn({batch, classes}).to(dtype).requires_grad_();
  const torch::Tensor target = torch::randint(classes, {batch}, torch::kLong);
  const Forward fused = [=] { return afterburner::kernels::cross_entropy(logits, target); };
  const Forward torch_ops = [=] { return torch::nn::functional::cross_entropy(logits, target); };
  const std::string label = "cross_entropy " + std::to_string(batch) + "x" + std::to_string(classes) + " " +
                            afterburner::train::to_string(precision);
  compare(label, forward_backward(fused, {logits}, precision), forward_backward(torch_ops, {logits}, precision), reps);
}

}  // namespace

int main(int argc, char** argv) try {
  const Settings settings = parse(argc, argv);
  afterburner::ThreadsGuard threads(settings.threads);
  afterburner::keep_freed_memory();
  torch::manual_seed(0);
  const afterburner::BlasInfo blas = afterburner::detect_blas();
  std::printf("forward+backward, %d threads, %d reps, BLAS %s; median [min, max]\n", settings.threads, settings.reps,
              blas.name.c_str());
  const std::vector<LinearShape> shapes{{"cnn fc1 128x3136->128", 128, 3136, 128, true},
                                        {"mlp fc1 256x784->1024", 256, 784, 1024, false},
                                        {"mlp fc2 256x1024->1024", 256, 1024, 1024, true}};
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    for (const auto& shape : shapes) bench_linear(shape, precision, settings.reps);
  }
  const std::vector<ConvShape> convolutions{{"cnn conv1 128x1->32 28x28", 128, 1, 32, 28, false},
                                            {"cnn conv2 128x32->64 14x14", 128, 32, 64, 14, true}};
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    for (const auto& shape : convolutions) bench_conv_relu(shape, precision, settings.reps);
  }
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    for (int64_t classes : {10, 1000}) {
      for (int64_t batch : {128, 256}) bench_cross_entropy(batch, classes, precision, settings.reps);
    }
  }
  return 0;
} catch (const afterburner::Error& e) {
  std::fprintf(stderr, "bench_fused_ops: %s\n", e.what());
  return e.exit_code();
}
