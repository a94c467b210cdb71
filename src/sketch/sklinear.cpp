#include "afterburner/sketch/sklinear.h"

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
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

using detail::shape;

// S1s [L, d_in, k], S2s [L, k, d_out], U1s [L, k, d_out], U2s [L, d_in, k]; throws UsageError
// naming the first tensor that does not fit.
void check_sklinear_shapes(const torch::Tensor& S1s, const torch::Tensor& S2s, const torch::Tensor& U1s,
                           const torch::Tensor& U2s) {
  if (S1s.dim() != 3) throw UsageError("SKLinear S1s", "expected [terms, in_features, rank], got " + shape(S1s));
  const int64_t terms = S1s.size(0), in = S1s.size(1), rank = S1s.size(2);
  if (S2s.dim() != 3 || S2s.size(0) != terms || S2s.size(1) != rank) {
    throw UsageError("SKLinear S2s", fmt::format("expected [{}, {}, out_features], got {}", terms, rank, shape(S2s)));
  }
  const int64_t out = S2s.size(2);
  if (!U1s.sizes().equals({terms, rank, out})) {
    throw UsageError("SKLinear U1s", fmt::format("expected [{}, {}, {}], got {}", terms, rank, out, shape(U1s)));
  }
  if (!U2s.sizes().equals({terms, in, rank})) {
    throw UsageError("SKLinear U2s", fmt::format("expected [{}, {}, {}], got {}", terms, in, rank, shape(U2s)));
  }
}

// bias [d_out] or undefined, input [..., d_in] for factors [d_in, w] and [w, d_out].
void check_factored_operands(const torch::Tensor& input, const SKLinearFactors& factors, const torch::Tensor& bias) {
  if (factors.first.dim() != 2 || factors.second.dim() != 2 || factors.first.size(1) != factors.second.size(0)) {
    throw UsageError("SKLinear factors", fmt::format("expected [in_features, w] and [w, out_features], got {} and {}",
                                                     shape(factors.first), shape(factors.second)));
  }
  const int64_t in = factors.first.size(0), out = factors.second.size(1);
  if (bias.defined() && !bias.sizes().equals({out})) {
    throw UsageError("SKLinear bias", fmt::format("expected [{}], got {}", out, shape(bias)));
  }
  if (input.dim() == 0 || input.size(-1) != in) {
    throw UsageError("SKLinear input", fmt::format("expected [..., {}], got {}", in, shape(input)));
  }
}

}  // namespace

bool sketch_saves_nothing(const SKLinearOptions& o) {
  return 2 * o.terms() * o.rank() * (o.in_features() + o.out_features()) > o.in_features() * o.out_features();
}

// S1_i = W U1_i^T and S2_i = U2_i^T W for W [d_in, d_out]: then E[(X S1_i) U1_i] = X W E[U1_i^T
// U1_i] = X W, and likewise for the second product, so the layer starts as an unbiased
// estimate of the dense one.
SKLinearTensors initial_sklinear_tensors(const SKLinearOptions& options, const torch::Tensor& dense_weight) {
  const int64_t in = options.in_features(), out = options.out_features();
  const int64_t terms = options.terms(), rank = options.rank();
  detail::require_at_least("SKLinear", 1, {{"in_features", in}, {"out_features", out}, {"terms", terms}, {"rank", rank}});
  detail::require_dense_layout("SKLinear", dense_weight, {out, in}, "torch::nn::Linear");
  if (sketch_saves_nothing(options)) {
    detail::warn_saves_nothing(fmt::format("SKLinear({}, {}, terms {}, rank {})", in, out, terms, rank),
                               fmt::format("runs {} multiply-adds per row, the dense layer {}",
                                           2 * terms * rank * (in + out), in * out));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor dense = dense_weight;
  if (!dense.defined()) {
    dense = torch::empty({out, in});
    torch::nn::init::kaiming_uniform_(dense, std::sqrt(5.0));  // torch::nn::Linear's draw
  }
  const torch::Tensor w = dense.to(torch::kFloat).t();  // [d_in, d_out]
  SKLinearTensors tensors;
  tensors.U1s = detail::scaled_signs({terms, rank, out}, rank);
  tensors.U2s = detail::scaled_signs({terms, in, rank}, rank);
  tensors.S1s = w.matmul(tensors.U1s.transpose(1, 2)).contiguous();
  tensors.S2s = tensors.U2s.transpose(1, 2).matmul(w).contiguous();
  if (options.bias()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    tensors.bias = torch::empty({out}).uniform_(-bound, bound);
  }
  return tensors;
}

SKLinearFactors sklinear_factors(const torch::Tensor& S1s, const torch::Tensor& S2s, const torch::Tensor& U1s,
                                 const torch::Tensor& U2s) {
  check_sklinear_shapes(S1s, S2s, U1s, U2s);
  const int64_t terms = S1s.size(0), in = S1s.size(1), out = S2s.size(2);
  const int64_t columns = terms * S1s.size(2);
  // Zero columns of `first` and rows of `second` up to padded_width(2Lk) leave the product as it is.
  const int64_t padding = padded_width(2 * columns) - 2 * columns;
  return {torch::cat({S1s.permute({1, 0, 2}).reshape({in, columns}), U2s.permute({1, 0, 2}).reshape({in, columns}),
                      torch::zeros({in, padding}, S1s.options())},
                     1),
          torch::cat({U1s.reshape({columns, out}), S2s.reshape({columns, out}), torch::zeros({padding, out}, S2s.options())},
                     0),
          1.0 / (2.0 * static_cast<double>(terms))};
}

torch::Tensor sketched_linear(const torch::Tensor& input, const SKLinearFactors& factors, const torch::Tensor& bias,
                              const kernels::LowRankEpilogue& epilogue) {
  check_factored_operands(input, factors, bias);
  const torch::Tensor rows = input.reshape({-1, factors.first.size(0)});
  torch::Tensor y = kernels::low_rank_linear(rows, factors.first, factors.second, bias, factors.scale, epilogue);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() = factors.second.size(1);
  return y.view(sizes);
}

torch::Tensor sketched_linear(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& S2s,
                              const torch::Tensor& U1s, const torch::Tensor& U2s, const torch::Tensor& bias,
                              const kernels::LowRankEpilogue& epilogue) {
  return sketched_linear(input, sklinear_factors(S1s, S2s, U1s, U2s), bias, epilogue);
}

SKLinearImpl::SKLinearImpl(const SKLinearOptions& options, const torch::Tensor& dense_weight)
    : options(options), dense_weight_(dense_weight) {
  reset();
  dense_weight_ = torch::Tensor();
}

void SKLinearImpl::reset() {
  if (!(options.dropout() >= 0 && options.dropout() <= 1)) {
    throw UsageError("SKLinear dropout", fmt::format("must be between 0 and 1, got {}", options.dropout()));
  }
  const SKLinearTensors tensors = initial_sklinear_tensors(options, dense_weight_);
  U1s = register_buffer("U1s", tensors.U1s);
  U2s = register_buffer("U2s", tensors.U2s);
  S1s = register_parameter("S1s", tensors.S1s);
  S2s = register_parameter("S2s", tensors.S2s);
  if (options.bias()) bias = register_parameter("bias", tensors.bias);
}

struct SKLinearImpl::KeptFactors {
  // Made of these tensors (held, so that their memory is not reused by others) at these versions.
  std::vector<torch::Tensor> sources;
  std::vector<const void*> data;
  std::vector<int64_t> versions;
  bool inference_mode = false;
  SKLinearFactors factors;

  static std::vector<torch::Tensor> sources_of(const SKLinearImpl& layer) {
    return {layer.S1s, layer.S2s, layer.U1s, layer.U2s};
  }

  bool made_of(const std::vector<torch::Tensor>& now) const {
    if (inference_mode != c10::InferenceMode::is_enabled()) return false;
    for (std::size_t i = 0; i < now.size(); ++i) {
      if (!now[i].is_same(sources[i]) || now[i].data_ptr() != data[i] || now[i]._version() != versions[i]) return false;
    }
    return true;
  }
};

torch::Tensor SKLinearImpl::forward(const torch::Tensor& input) {
  const auto epilogue =
      kernels::LowRankEpilogue().relu(options.relu()).dropout(options.dropout()).train(is_training());
  const bool needs_gradient = torch::GradMode::is_enabled() && (S1s.requires_grad() || S2s.requires_grad());
  std::vector<torch::Tensor> sources = KeptFactors::sources_of(*this);
  // Inference tensors keep no version counter: their changes cannot be seen.
  const bool versioned = std::none_of(sources.begin(), sources.end(), [](const torch::Tensor& t) { return t.is_inference(); });
  if (needs_gradient || !versioned) {
    std::atomic_store(&kept_, std::shared_ptr<KeptFactors>());  // training: free them
    return sketched_linear(input, S1s, S2s, U1s, U2s, bias, epilogue);
  }
  // Calls from several threads each see whole factors (shared_ptr's atomic access).
  std::shared_ptr<KeptFactors> kept = std::atomic_load(&kept_);
  if (!kept || !kept->made_of(sources)) {
    kept = std::make_shared<KeptFactors>();
    kept->factors = sklinear_factors(S1s, S2s, U1s, U2s);
    kept->inference_mode = c10::InferenceMode::is_enabled();
    for (const torch::Tensor& source : sources) {
      kept->data.push_back(source.data_ptr());
      kept->versions.push_back(source._version());
    }
    kept->sources = std::move(sources);
    std::atomic_store(&kept_, kept);
  }
  return sketched_linear(input, kept->factors, bias, epilogue);
}

void SKLinearImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("afterburner::sketch::SKLinear(in_features={}, out_features={}, terms={}, rank={}, bias={}",
                        options.in_features(), options.out_features(), options.terms(), options.rank(),
                        options.bias());
  if (options.relu()) stream << ", relu=true";
  if (options.dropout() > 0) stream << fmt::format(", dropout={}", options.dropout());
  stream << ")";
}

}  // namespace afterburner::sketch
