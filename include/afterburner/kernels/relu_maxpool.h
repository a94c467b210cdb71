// Fused ReLU + max-pooling for training: max_pool2d(relu(x)) in one pass over x, keeping one
// byte per output (which window element won, or "none" where ReLU zeroed the output) instead of
// torch's ReLU output and int64 indices. Backward writes the input gradient in one pass, with no
// separate zero fill.
//
//   namespace kernels = afterburner::kernels;
//   auto y = kernels::relu_max_pool2d(x);                  // == max_pool2d(relu(x), 2, 2)
//   auto z = kernels::relu_max_pool2d(x, /*kernel=*/3, /*stride=*/3);
//
//   torch::nn::Sequential cnn(
//       torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)),
//       kernels::ReluMaxPool2d(2),                         // replaces ReLU() + MaxPool2d(2)
//       ...);
//
// Fast path: fp32, bf16 or fp64; 4-D, contiguous in NCHW or channels_last (the output keeps the
// input's memory format); kernel == stride <= 15, no padding or dilation. Overlapping or padded
// windows (ResNet's 3x3 stride-2 padding-1 pool; dilation 1) take a kernel of ours where no
// gradient is recorded (inference), torch's composition where one is. oneDNN tensors
// (`to_mkldnn()`, an optimized inference graph's) pool in their own layout and stay oneDNN
// tensors. Anything else runs torch's relu + max_pool2d with the same options. Ties and NaNs
// follow torch: the first maximal element in row-major order wins, a NaN anywhere in the window
// makes the output NaN.
#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <ostream>

namespace afterburner::kernels {

// Square windows only; stride defaults to the kernel size, like torch::nn::MaxPool2dOptions.
struct ReluMaxPool2dOptions {
  /* implicit */ ReluMaxPool2dOptions(int64_t kernel_size = 2)
      : kernel_size_(kernel_size), stride_(kernel_size) {}
  TORCH_ARG(int64_t, kernel_size);
  TORCH_ARG(int64_t, stride);
  TORCH_ARG(int64_t, padding) = 0;
  TORCH_ARG(int64_t, dilation) = 1;
  TORCH_ARG(bool, ceil_mode) = false;
};

// Throws UsageError naming the field for a kernel_size, stride or dilation < 1 or a padding < 0.
void validate(const ReluMaxPool2dOptions& options);

// max_pool2d(relu(x)), differentiable with respect to x. Under no-grad or inference mode the
// winner record is skipped. Throws UsageError for bad options (see validate).
torch::Tensor relu_max_pool2d(const torch::Tensor& x, const ReluMaxPool2dOptions& options);
torch::Tensor relu_max_pool2d(const torch::Tensor& x, int64_t kernel = 2, int64_t stride = 2);

class ReluMaxPool2dImpl : public torch::nn::Cloneable<ReluMaxPool2dImpl> {
 public:
  // Throws UsageError for bad options (see validate).
  explicit ReluMaxPool2dImpl(const ReluMaxPool2dOptions& options = {});
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& x);

  ReluMaxPool2dOptions options;
};
TORCH_MODULE(ReluMaxPool2d);

}  // namespace afterburner::kernels
