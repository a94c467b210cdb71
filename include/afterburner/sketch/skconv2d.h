// SKConv2d: a 2-D convolution replaced by 2L sketched low-rank terms (as in the Panther
// library): a convolution to 2Lk channels, then a fixed random mix of those down to C_out.
// Fewer parameters and FLOPs than torch::nn::Conv2d when 2Lk is below C_out.
//
//   namespace sketch = afterburner::sketch;
//   sketch::SKConv2d layer(sketch::SKConv2dOptions(32, 64, 3).padding(1).terms(1).rank(8));
//   torch::Tensor y = layer(x);                                  // x [N, 32, H, W] -> [N, 64, H, W]
//
//   torch::nn::Conv2d dense(torch::nn::Conv2dOptions(32, 64, 3).padding(1));  // from trained weights:
//   sketch::SKConv2d sketched(sketch::SKConv2dOptions(32, 64, 3).padding(1), dense->weight);
//
// Parameter S1s [2Lk, C_in, Kh, Kw] (trained), buffer U1s [2L, k, C_out] (fixed, entries
// +-1/sqrt(k), saved with the module), bias [C_out].
#pragma once

#include <torch/arg.h>
#include <torch/expanding_array.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <ostream>

namespace afterburner::sketch {

struct SKConv2dOptions {
  SKConv2dOptions(int64_t in_channels, int64_t out_channels, torch::ExpandingArray<2> kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  TORCH_ARG(int64_t, in_channels);
  TORCH_ARG(int64_t, out_channels);
  TORCH_ARG(torch::ExpandingArray<2>, kernel_size);
  TORCH_ARG(torch::ExpandingArray<2>, stride) = 1;
  TORCH_ARG(torch::ExpandingArray<2>, padding) = 0;
  TORCH_ARG(int64_t, terms) = 1;  // L
  TORCH_ARG(int64_t, rank) = 8;   // k
  TORCH_ARG(bool, bias) = true;
};

// Y[:, o] = 1/(2L) sum_{i<2L, kappa<k} U1_i[kappa, o] (X * S1_i[kappa]) + b[o], with * the
// convolution. Gradients reach X, S1s and b, never U1s.
class SKConv2dImpl : public torch::nn::Cloneable<SKConv2dImpl> {
 public:
  // `dense_weight`, in torch::nn::Conv2d's layout [C_out, C_in, Kh, Kw], initialises the terms
  // so that the layer estimates it (S1_i[kappa] = sum_o U1_i[kappa, o] K[o]); undefined: a
  // Kaiming-uniform K as torch::nn::Conv2d would draw. The bias is drawn as torch::nn::Conv2d
  // draws it. Throws UsageError naming the field for sizes or strides below 1, negative padding
  // or a dense_weight of another shape.
  explicit SKConv2dImpl(const SKConv2dOptions& options, const torch::Tensor& dense_weight = {});

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  // [N, C_in, H, W] -> [N, C_out, H', W'], H' and W' as torch::nn::Conv2d gives them.
  torch::Tensor forward(const torch::Tensor& input);

  SKConv2dOptions options;
  torch::Tensor S1s, U1s, bias;  // the names of Panther's layer; bias undefined without it

 private:
  torch::Tensor dense_weight_;  // only to initialise; not kept as a parameter
};

TORCH_MODULE(SKConv2d);

// The layer's tensors, as a fresh SKConv2dImpl(options, dense_weight) draws them (bias undefined
// without options.bias()): the op afterburner::skconv2d_init. Throws UsageError for sizes below 1
// or a dense weight of another shape.
struct SKConv2dTensors {
  torch::Tensor S1s, U1s, bias;
};
SKConv2dTensors initial_skconv2d_tensors(const SKConv2dOptions& options, const torch::Tensor& dense_weight = {});

// SKConv2d's forward over given tensors (channels, terms and kernel size read from their shapes;
// bias may be undefined): the op afterburner::skconv2d. Throws UsageError naming the first tensor
// whose shape does not fit.
torch::Tensor sketched_conv2d(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& U1s,
                              const torch::Tensor& bias, torch::IntArrayRef stride, torch::IntArrayRef padding);

// True when 2Lk >= C_out: S1s (2Lk C_in Kh Kw) is at least as large as the dense kernel
// (C_out C_in Kh Kw).
bool sketch_saves_nothing(const SKConv2dOptions& options);

}  // namespace afterburner::sketch
