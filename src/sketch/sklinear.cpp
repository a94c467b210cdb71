#include "afterburner/sketch/sklinear.h"

#include <fmt/format.h>
#include <torch/nn/init.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "afterburner/core/error.h"

namespace afterburner::sketch {
namespace {

// L independent k-column sign matrices scaled to unit expected column norm: +-1/sqrt(k).
torch::Tensor scaled_signs(std::vector<int64_t> shape, int64_t rank) {
  return (torch::randint(0, 2, shape, torch::kFloat) * 2 - 1) / std::sqrt(static_cast<double>(rank));
}

void check_options(const SKLinearOptions& o) {
  for (auto [name, value] : {std::pair<const char*, int64_t>{"in_features", o.in_features()},
                             {"out_features", o.out_features()},
                             {"terms", o.terms()},
                             {"rank", o.rank()}}) {
    if (value < 1) throw UsageError(std::string("SKLinear ") + name, "must be at least 1, got " + std::to_string(value));
  }
}

}  // namespace

bool sketch_saves_nothing(const SKLinearOptions& o) {
  return 2 * o.terms() * o.rank() * (o.in_features() + o.out_features()) > o.in_features() * o.out_features();
}

SKLinearImpl::SKLinearImpl(const SKLinearOptions& options, const torch::Tensor& dense_weight)
    : options(options), dense_weight_(dense_weight) {
  check_options(options);
  if (dense_weight.defined() && dense_weight.sizes() != torch::IntArrayRef{options.out_features(), options.in_features()}) {
    throw UsageError("SKLinear dense_weight", fmt::format("expected [{}, {}] (torch::nn::Linear's layout), got {}",
                                                          options.out_features(), options.in_features(),
                                                          c10::str(dense_weight.sizes())));
  }
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
    std::cerr << fmt::format("afterburner: SKLinear({}, {}, terms {}, rank {}) has {} parameters, the dense layer {}: "
                             "no saving\n",
                             in, out, terms, rank, 2 * terms * rank * (in + out), in * out);
  }
  torch::NoGradGuard no_grad;
  torch::Tensor dense = dense_weight_;
  if (!dense.defined()) {
    dense = torch::empty({out, in});
    torch::nn::init::kaiming_uniform_(dense, std::sqrt(5.0));  // torch::nn::Linear's draw
  }
  const torch::Tensor w = dense.to(torch::kFloat).t();  // [d_in, d_out]
  U1s = register_buffer("U1s", scaled_signs({terms, rank, out}, rank));
  U2s = register_buffer("U2s", scaled_signs({terms, in, rank}, rank));
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
  const torch::Tensor first = torch::cat({S1s.permute({1, 0, 2}).reshape({in, columns}),
                                          U2s.permute({1, 0, 2}).reshape({in, columns})}, 1);  // [d_in, 2Lk]
  const torch::Tensor second = torch::cat({U1s.reshape({columns, out}), S2s.reshape({columns, out})}, 0);  // [2Lk, d_out]
  const double scale = 1.0 / (2.0 * static_cast<double>(options.terms()));
  const torch::Tensor projected = rows.mm(first);
  torch::Tensor y = bias.defined() ? torch::addmm(bias, projected, second, 1.0, scale) : projected.mm(second) * scale;
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
