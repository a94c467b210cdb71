#include "afterburner/sketch/skconv2d.h"

#include <c10/util/StringUtil.h>
#include <fmt/format.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>

#include "afterburner/core/error.h"
#include "signs.h"

namespace afterburner::sketch {
namespace {

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

}  // namespace

bool sketch_saves_nothing(const SKConv2dOptions& o) { return 2 * o.terms() * o.rank() >= o.out_channels(); }

SKConv2dImpl::SKConv2dImpl(const SKConv2dOptions& options, const torch::Tensor& dense_weight)
    : options(options), dense_weight_(dense_weight) {
  check_options(options);
  const auto kernel = *options.kernel_size();
  detail::require_dense_layout("SKConv2d", dense_weight,
                               {options.out_channels(), options.in_channels(), kernel[0], kernel[1]},
                               "torch::nn::Conv2d");
  reset();
  dense_weight_ = torch::Tensor();
}

// S1_i[kappa] = sum_o U1_i[kappa, o] K[o]: then E[sum_kappa U1_i[kappa, o] S1_i[kappa]] =
// sum_o' E[U1_i^T U1_i][o, o'] K[o'] = K[o], so each of the 2L terms, and their mean, starts as an
// unbiased estimate of the dense convolution. K and b are drawn first, in torch::nn::Conv2d's
// order, so that a Conv2d seeded alike is the layer this one estimates.
void SKConv2dImpl::reset() {
  const int64_t in = options.in_channels(), out = options.out_channels();
  const int64_t terms = options.terms(), rank = options.rank();
  const auto kernel = *options.kernel_size();
  const int64_t taps = in * kernel[0] * kernel[1];
  if (sketch_saves_nothing(options)) {
    detail::warn_saves_nothing(fmt::format("SKConv2d({}, {}, kernel {}x{}, terms {}, rank {})", in, out, kernel[0],
                                           kernel[1], terms, rank),
                               fmt::format("has {} parameters, the dense layer {}", 2 * terms * rank * taps, out * taps));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor dense = dense_weight_;
  if (!dense.defined()) {
    dense = torch::empty({out, in, kernel[0], kernel[1]});
    torch::nn::init::kaiming_uniform_(dense, std::sqrt(5.0));
  }
  torch::Tensor drawn_bias;
  if (options.bias()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(taps));
    drawn_bias = torch::empty({out}).uniform_(-bound, bound);
  }
  U1s = register_buffer("U1s", detail::scaled_signs({2 * terms, rank, out}, rank));
  const torch::Tensor mixed = U1s.reshape({2 * terms * rank, out}).mm(dense.to(torch::kFloat).reshape({out, taps}));
  S1s = register_parameter("S1s", mixed.view({2 * terms * rank, in, kernel[0], kernel[1]}));
  if (options.bias()) bias = register_parameter("bias", drawn_bias);
}

// Y = 1/(2L) U^T conv2d(X, S1s) + b with U = U1s as [2Lk, C_out]: all terms mixed by one 1x1 conv.
torch::Tensor SKConv2dImpl::forward(const torch::Tensor& input) {
  const int64_t in = options.in_channels(), out = options.out_channels();
  const int64_t channels = 2 * options.terms() * options.rank();
  if (input.dim() != 4 || input.size(1) != in) {
    throw UsageError("SKConv2d input", fmt::format("expected [N, {}, H, W], got {}", in, c10::str(input.sizes())));
  }
  const torch::Tensor sketched = torch::conv2d(input, S1s, {}, options.stride(), options.padding());
  const double scale = 1.0 / (2.0 * static_cast<double>(options.terms()));
  // A 1x1 convolution: measured fastest for channels_last input and, over the shapes, on par
  // with a batched GEMM for NCHW input; it keeps the input's memory format either way.
  const torch::Tensor mix = (U1s.reshape({channels, out}).t() * scale).reshape({out, channels, 1, 1});
  return torch::conv2d(sketched, mix, bias);
}

void SKConv2dImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "afterburner::sketch::SKConv2d(in_channels={}, out_channels={}, kernel_size={}, stride={}, padding={}, "
      "terms={}, rank={}, bias={})",
      options.in_channels(), options.out_channels(), c10::str(options.kernel_size()), c10::str(options.stride()),
      c10::str(options.padding()), options.terms(), options.rank(), options.bias());
}

}  // namespace afterburner::sketch
