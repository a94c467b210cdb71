#include "afterburner/sketch/skconv2d.h"

#include <c10/util/StringUtil.h>
#include <fmt/format.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "afterburner/core/error.h"
#include "signs.h"

namespace afterburner::sketch {
namespace {

using detail::shape;

void check_options(const SKConv2dOptions& o) {
  const auto kernel = *o.kernel_size();
  const auto stride = *o.stride();
  detail::require_at_least("SKConv2d", 1,
                           {{"in_channels", o.in_channels()},
                            {"out_channels", o.out_channels()},
                            {"kernel_size", std::min(kernel[0], kernel[1])},
                            {"stride", std::min(stride[0], stride[1])},
                            {"terms", o.terms()},
                            {"rank", o.rank()}});
  const auto padding = *o.padding();
  detail::require_at_least("SKConv2d", 0, {{"padding", std::min(padding[0], padding[1])}});
}

// S1s [2Lk, C_in, Kh, Kw], U1s [2L, k, C_out], bias [C_out] or undefined, input [N, C_in, H, W];
// throws UsageError naming the first tensor that does not fit.
void check_skconv2d_shapes(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& U1s,
                           const torch::Tensor& bias) {
  if (S1s.dim() != 4) throw UsageError("SKConv2d S1s", "expected [2 terms rank, in_channels, Kh, Kw], got " + shape(S1s));
  if (U1s.dim() != 3 || U1s.size(0) * U1s.size(1) != S1s.size(0)) {
    throw UsageError("SKConv2d U1s",
                     fmt::format("expected [2 terms, rank, out_channels] with 2 terms rank = {}, got {}", S1s.size(0),
                                 shape(U1s)));
  }
  if (bias.defined() && !bias.sizes().equals({U1s.size(2)})) {
    throw UsageError("SKConv2d bias", fmt::format("expected [{}], got {}", U1s.size(2), shape(bias)));
  }
  if (input.dim() != 4 || input.size(1) != S1s.size(1)) {
    throw UsageError("SKConv2d input", fmt::format("expected [N, {}, H, W], got {}", S1s.size(1), shape(input)));
  }
}

}  // namespace

bool sketch_saves_nothing(const SKConv2dOptions& o) { return 2 * o.terms() * o.rank() >= o.out_channels(); }

// S1_i[kappa] = sum_o U1_i[kappa, o] K[o]: then E[sum_kappa U1_i[kappa, o] S1_i[kappa]] =
// sum_o' E[U1_i^T U1_i][o, o'] K[o'] = K[o], so each of the 2L terms, and their mean, starts as an
// unbiased estimate of the dense convolution. K and b are drawn first, in torch::nn::Conv2d's
// order, so that a Conv2d seeded alike is the layer this one estimates.
SKConv2dTensors initial_skconv2d_tensors(const SKConv2dOptions& options, const torch::Tensor& dense_weight) {
  check_options(options);
  const int64_t in = options.in_channels(), out = options.out_channels();
  const int64_t terms = options.terms(), rank = options.rank();
  const auto kernel = *options.kernel_size();
  const int64_t taps = in * kernel[0] * kernel[1];
  detail::require_dense_layout("SKConv2d", dense_weight, {out, in, kernel[0], kernel[1]}, "torch::nn::Conv2d");
  if (sketch_saves_nothing(options)) {
    detail::warn_saves_nothing(fmt::format("SKConv2d({}, {}, kernel {}x{}, terms {}, rank {})", in, out, kernel[0],
                                           kernel[1], terms, rank),
                               fmt::format("has {} parameters, the dense layer {}", 2 * terms * rank * taps, out * taps));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor dense = dense_weight;
  if (!dense.defined()) {
    dense = torch::empty({out, in, kernel[0], kernel[1]});
    torch::nn::init::kaiming_uniform_(dense, std::sqrt(5.0));
  }
  SKConv2dTensors tensors;
  if (options.bias()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(taps));
    tensors.bias = torch::empty({out}).uniform_(-bound, bound);
  }
  tensors.U1s = detail::scaled_signs({2 * terms, rank, out}, rank);
  tensors.S1s = tensors.U1s.reshape({2 * terms * rank, out})
                    .mm(dense.to(torch::kFloat).reshape({out, taps}))
                    .view({2 * terms * rank, in, kernel[0], kernel[1]});
  return tensors;
}

SKConv2dImpl::SKConv2dImpl(const SKConv2dOptions& options, const torch::Tensor& dense_weight)
    : options(options), dense_weight_(dense_weight) {
  reset();
  dense_weight_ = torch::Tensor();
}

void SKConv2dImpl::reset() {
  const SKConv2dTensors tensors = initial_skconv2d_tensors(options, dense_weight_);
  U1s = register_buffer("U1s", tensors.U1s);
  S1s = register_parameter("S1s", tensors.S1s);
  if (options.bias()) bias = register_parameter("bias", tensors.bias);
}

// Y = 1/(2L) U^T conv2d(X, S1s) + b with U = U1s as [2Lk, C_out]: all terms mixed by one 1x1 conv.
torch::Tensor sketched_conv2d(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& U1s,
                              const torch::Tensor& bias, torch::IntArrayRef stride, torch::IntArrayRef padding) {
  check_skconv2d_shapes(input, S1s, U1s, bias);
  const int64_t channels = S1s.size(0), out = U1s.size(2);
  const torch::Tensor sketched = torch::conv2d(input, S1s, {}, stride, padding);
  const double scale = 1.0 / static_cast<double>(U1s.size(0));
  // A 1x1 convolution: measured fastest for channels_last input and, over the shapes, on par
  // with a batched GEMM for NCHW input; it keeps the input's memory format either way.
  const torch::Tensor mix = (U1s.reshape({channels, out}).t() * scale).reshape({out, channels, 1, 1});
  return torch::conv2d(sketched, mix, bias);
}

torch::Tensor SKConv2dImpl::forward(const torch::Tensor& input) {
  return sketched_conv2d(input, S1s, U1s, bias, options.stride(), options.padding());
}

void SKConv2dImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "afterburner::sketch::SKConv2d(in_channels={}, out_channels={}, kernel_size={}, stride={}, padding={}, "
      "terms={}, rank={}, bias={})",
      options.in_channels(), options.out_channels(), c10::str(options.kernel_size()), c10::str(options.stride()),
      c10::str(options.padding()), options.terms(), options.rank(), options.bias());
}

}  // namespace afterburner::sketch
