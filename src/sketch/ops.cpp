// The sketched layers as dispatcher ops beside the fused kernels (src/kernels/ops.cpp), for the
// Python package's afterburner.nn.SKLinear and SKConv2d and for TorchScript files that use them.
// All are composite: gradients flow through the kernels they are made of.
#include <torch/library.h>

#include <tuple>

#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::sketch {
namespace {

torch::Tensor sketched_linear_op(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& S2s,
                                 const torch::Tensor& U1s, const torch::Tensor& U2s,
                                 const c10::optional<torch::Tensor>& bias) {
  return sketched_linear(input, S1s, S2s, U1s, U2s, bias.value_or(torch::Tensor()));
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> initial_sklinear_op(
    int64_t in_features, int64_t out_features, int64_t num_terms, int64_t low_rank,
    const c10::optional<torch::Tensor>& W_init, bool bias) {
  const SKLinearTensors tensors = initial_sklinear_tensors(
      SKLinearOptions(in_features, out_features).terms(num_terms).rank(low_rank).bias(bias),
      W_init.value_or(torch::Tensor()));
  return {tensors.S1s, tensors.S2s, tensors.U1s, tensors.U2s, tensors.bias};
}

torch::Tensor sketched_conv2d_op(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& U1s,
                                 const c10::optional<torch::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding) {
  return sketched_conv2d(input, S1s, U1s, bias.value_or(torch::Tensor()), stride, padding);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> initial_skconv2d_op(
    int64_t in_channels, int64_t out_channels, c10::IntArrayRef kernel_size, int64_t num_terms, int64_t low_rank,
    const c10::optional<torch::Tensor>& weight, bool bias) {
  const SKConv2dTensors tensors = initial_skconv2d_tensors(
      SKConv2dOptions(in_channels, out_channels, kernel_size).terms(num_terms).rank(low_rank).bias(bias),
      weight.value_or(torch::Tensor()));
  return {tensors.S1s, tensors.U1s, tensors.bias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(afterburner, m) {
  // 1/(2L) sum_i [(x S1s[i]) U1s[i] + (x U2s[i]) S2s[i]] + bias, as two GEMMs (SKLinear's forward).
  m.def("sklinear(Tensor input, Tensor S1s, Tensor S2s, Tensor U1s, Tensor U2s, Tensor? bias=None) -> Tensor",
        sketched_linear_op);
  // SKLinear's initial tensors: S1s, S2s, U1s, U2s and bias (None without one), from W_init
  // ([out_features, in_features], torch.nn.Linear's layout) or from torch.nn.Linear's draw.
  m.def("sklinear_init(int in_features, int out_features, int num_terms, int low_rank, Tensor? W_init=None, "
        "bool bias=True) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        initial_sklinear_op);
  // 1/(2L) sum_{i, kappa} U1s[i, kappa, :] conv2d(input, S1s[i k + kappa]) + bias (SKConv2d's forward).
  m.def("skconv2d(Tensor input, Tensor S1s, Tensor U1s, Tensor? bias=None, int[2] stride=1, int[2] padding=0) -> "
        "Tensor",
        sketched_conv2d_op);
  // SKConv2d's initial tensors: S1s, U1s and bias (None without one), from weight ([out_channels,
  // in_channels, Kh, Kw], torch.nn.Conv2d's layout) or from torch.nn.Conv2d's draw.
  m.def("skconv2d_init(int in_channels, int out_channels, int[2] kernel_size, int num_terms, int low_rank, "
        "Tensor? weight=None, bool bias=True) -> (Tensor, Tensor, Tensor)",
        initial_skconv2d_op);
}

}  // namespace afterburner::sketch
