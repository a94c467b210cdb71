// Linear + bias + ReLU as one autograd node: one GEMM with the bias folded in, the ReLU applied
// in place on its output, and only that output (not the pre-activation) kept for backward.
// Under CPU autocast the GEMM runs in the autocast dtype, as torch::linear's would. The backward
// is differentiable itself (create_graph).
//
//   namespace kernels = afterburner::kernels;
//   kernels::LinearReLU fc1(kernels::LinearReLUOptions(3136, 128));
//   torch::Tensor hidden = fc1(features);                       // relu(features W^T + b)
//
//   torch::nn::Linear trained(784, 1024);
//   auto fused = kernels::LinearReLUImpl::from_linear(trained);  // same weight and bias tensors
//
//   torch::Tensor y = kernels::linear_relu(x, weight, bias);    // functional form; bias may be {}
//   torch::Tensor z = kernels::linear(x, weight, bias);         // the same without the ReLU
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace afterburner::kernels {

// relu(x W^T + b) for x of shape [..., in_features], weight [out_features, in_features] and
// bias [out_features] or undefined; the result has shape [..., out_features].
torch::Tensor linear_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// x W^T + b (torch::linear's result) as one autograd node on the same GEMMs: LibTorch sends fp32
// products to OpenBLAS, whose thread pool competes with the OpenMP one (kernels/gemm.h).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// Same options as torch::nn::Linear, so its configuration carries over unchanged.
using LinearReLUOptions = torch::nn::LinearOptions;

class LinearReLU;

// A torch::nn::Linear followed by torch::nn::ReLU, fused: parameters `weight` and `bias` have
// Linear's shapes and default initialization.
class LinearReLUImpl : public torch::nn::Cloneable<LinearReLUImpl> {
 public:
  LinearReLUImpl(int64_t in_features, int64_t out_features)
      : LinearReLUImpl(LinearReLUOptions(in_features, out_features)) {}
  explicit LinearReLUImpl(const LinearReLUOptions& options);

  // A module over `linear`'s own weight and bias tensors: training either one trains both.
  static LinearReLU from_linear(const torch::nn::Linear& linear);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  LinearReLUOptions options;
  torch::Tensor weight;
  torch::Tensor bias;  // undefined when options.bias() is false

 private:
  LinearReLUImpl(const LinearReLUOptions& options, const torch::Tensor& weight, const torch::Tensor& bias);
  void register_parameters(const torch::Tensor& weight, const torch::Tensor& bias);
};

TORCH_MODULE(LinearReLU);

}  // namespace afterburner::kernels
