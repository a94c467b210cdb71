#include "afterburner/sketch/sklinear.h"

#include <fmt/format.h>
#include <torch/nn/init.h>

#include <cmath>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/kernels/low_rank.h"
#include "signs.h"

namespace afterburner::sketch {

namespace {

// The GEMMs' inner width rounded up to a multiple of 16 floats (one AVX-512 register) when that
// adds at most an eighth: at 8192 x 8192, batch 64, 2Lk = 30 ran 35% slower than 2Lk = 32.
int64_t padded_width(int64_t width) {
  const int64_t padded = (width + 15) / 16 * 16;
  return (padded - width) * 8 <= width ? padded : width;
}

}  // namespace

bool sketch_saves_nothing(const SKLinearOptions& o) {
  return 2 * o.terms() * o.rank() * (o.in_features() + o.out_features()) > o.in_features() * o.out_features();
}

SKLinearImpl::SKLinearImpl(const SKLinearOptions& options, const torch::Tensor& dense_weight)
    : options(options), dense_weight_(dense_weight) {
  detail::require_at_least("SKLinear", 1,
                           {{"in_features", options.in_features()},
                            {"out_features", options.out_features()},
                            {"terms", options.terms()},
                            {"rank", options.rank()}});
  detail::require_dense_layout("SKLinear", dense_weight, {options.out_features(), options.in_features()},
                               "torch::nn::Linear");
  reset();
  dense_weight_ = torch::Tensor();
}

// S1_i = W U1_i^T and S2_i = U2_i^T W for W [d_in, d_out]: then E[(X S1_i) U1_i] = X W E[U1_i^T
// U1_i] = X W, and likewise for the second product, so the layer starts as an unbiased
// estimate of the dense one.
void SKLinearImpl::reset() {
  const int64_t in = options.in_features(), out = options.out_features();
  const int64_t terms = options.terms(), rank = options.rank();
  if (sketch_saves_nothing(options)) {
    detail::warn_saves_nothing(fmt::format("SKLinear({}, {}, terms {}, rank {})", in, out, terms, rank),
                               fmt::format("runs {} multiply-adds per row, the dense layer {}",
                                           2 * terms * rank * (in + out), in * out));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor dense = dense_weight_;
  if (!dense.defined()) {
    dense = torch::empty({out, in});
    torch::nn::init::kaiming_uniform_(dense, std::sqrt(5.0));  // torch::nn::Linear's draw
  }
  const torch::Tensor w = dense.to(torch::kFloat).t();  // [d_in, d_out]
  U1s = register_buffer("U1s", detail::scaled_signs({terms, rank, out}, rank));
  U2s = register_buffer("U2s", detail::scaled_signs({terms, in, rank}, rank));
  S1s = register_parameter("S1s", w.matmul(U1s.transpose(1, 2)).contiguous());
  S2s = register_parameter("S2s", U2s.transpose(1, 2).matmul(w).contiguous());
  if (options.bias()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    bias = register_parameter("bias", torch::empty({out}).uniform_(-bound, bound));
  }
}

torch::Tensor SKLinearImpl::forward(const torch::Tensor& input) {
  const int64_t in = options.in_features(), out = options.out_features();
  const int64_t columns = options.terms() * options.rank();
  if (input.dim() == 0 || input.size(-1) != in) {
    throw UsageError("SKLinear input", fmt::format("expected [..., {}], got {}", in, c10::str(input.sizes())));
  }
  const torch::Tensor rows = input.reshape({-1, in});
  // Zero columns of `first` and rows of `second` up to padded_width(2Lk) leave the product as it is.
  const int64_t padding = padded_width(2 * columns) - 2 * columns;
  const torch::Tensor first = torch::cat({S1s.permute({1, 0, 2}).reshape({in, columns}),
                                          U2s.permute({1, 0, 2}).reshape({in, columns}),
                                          torch::zeros({in, padding}, S1s.options())}, 1);  // [d_in, 2Lk + padding]
  const torch::Tensor second = torch::cat({U1s.reshape({columns, out}), S2s.reshape({columns, out}),
                                           torch::zeros({padding, out}, S2s.options())}, 0);  // [2Lk + padding, d_out]
  const double scale = 1.0 / (2.0 * static_cast<double>(options.terms()));
  torch::Tensor y = kernels::low_rank_linear(rows, first, second, bias, scale);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
}

void SKLinearImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("afterburner::sketch::SKLinear(in_features={}, out_features={}, terms={}, rank={}, bias={})",
                        options.in_features(), options.out_features(), options.terms(), options.rank(),
                        options.bias());
}

}  // namespace afterburner::sketch
