// Conv2d + bias + ReLU as one autograd node: LibTorch's convolution (oneDNN) with the bias
// folded in, the ReLU applied in place on its output, and backward masking the gradient with
// that output before one convolution_backward. The unfused pair allocates and writes a second
// activation of the output's size for the ReLU; this writes none.
// Under CPU autocast the convolution runs in the autocast dtype, as torch::conv2d's would.
//
//   namespace kernels = afterburner::kernels;
//   kernels::Conv2dReLU conv(kernels::Conv2dReLUOptions(3, 16, 3).padding(1));
//   torch::Tensor y = conv(images);                       // relu(conv2d(images, W, b, 1, 1))
//
//   torch::nn::Conv2d trained(torch::nn::Conv2dOptions(3, 16, 3));
//   auto fused = kernels::Conv2dReLUImpl::from_conv(trained);   // same weight and bias tensors
//
//   torch::Tensor y2 = kernels::conv2d_relu(images, weight, bias, {1, 1}, {1, 1});  // functional
//
// Padding modes other than zeros, and "same" padding, are not supported: from_conv refuses them
// (fuse() leaves such layers unfused with a notice).
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>
#include <string>

namespace afterburner::kernels {

// relu(conv2d(x, weight, bias, stride, padding, dilation, groups)) for a batched [N, C, H, W] or
// unbatched [C, H, W] x, with explicit zero padding; bias may be undefined.
torch::Tensor conv2d_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          at::IntArrayRef stride = {1, 1}, at::IntArrayRef padding = {0, 0},
                          at::IntArrayRef dilation = {1, 1}, int64_t groups = 1);

// Same options as torch::nn::Conv2d, so its configuration carries over unchanged.
using Conv2dReLUOptions = torch::nn::Conv2dOptions;

// Why `conv` followed by ReLU cannot take the fused path, or "" when it can.
std::string conv_relu_unsupported(const torch::nn::Conv2d& conv);

class Conv2dReLU;

// A torch::nn::Conv2d followed by torch::nn::ReLU, fused: parameters `weight` and `bias` have
// Conv2d's shapes and default initialization.
class Conv2dReLUImpl : public torch::nn::Cloneable<Conv2dReLUImpl> {
 public:
  // Throws UsageError for padding it does not support.
  explicit Conv2dReLUImpl(const Conv2dReLUOptions& options);

  // A module over `conv`'s own weight and bias tensors: training either one trains both.
  static Conv2dReLU from_conv(const torch::nn::Conv2d& conv);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  Conv2dReLUOptions options;
  torch::Tensor weight;
  torch::Tensor bias;  // undefined when options.bias() is false

 private:
  Conv2dReLUImpl(const Conv2dReLUOptions& options, const torch::Tensor& weight, const torch::Tensor& bias);
  void register_parameters(const torch::Tensor& weight, const torch::Tensor& bias);
};

TORCH_MODULE(Conv2dReLU);

}  // namespace afterburner::kernels
