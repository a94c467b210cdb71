#include "afterburner/kernels/low_rank.h"

#include <ATen/Parallel.h>
#include <c10/util/StringUtil.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "afterburner/core/error.h"
#include "afterburner/kernels/gemm.h"
#include "autocast_argument.h"
#include "dropout_noise.h"
#include "gradients_of.h"
#include "simd.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Dropout's byte per element, kept for backward.
constexpr uint8_t kKeptByDropout = 1;  // dropout multiplied it by 1 / keep, not by 0
constexpr uint8_t kPassedByRelu = 2;   // relu's gradient passes: the pre-activation is not <= 0
constexpr int64_t kEpilogueGrain = 32768;  // elements per parallel task, at least

// What the epilogue does: relu, and dropout with its kept value (1 / keep in the output's dtype).
struct ActiveEpilogue {
  bool relu = false, dropout = false;
  double keep = 1.0;
};

ActiveEpilogue active(const LowRankEpilogue& e) {
  return {e.relu(), e.train() && e.dropout() > 0, 1.0 - e.dropout()};
}

// The values a pass works on at once: 16 float lanes for float and bf16 storage (simd.h), one
// double for double; codes travel as 32-bit lanes beside them.
template <typename T>
struct Lanes {
  using V = simd::Vec;
  using Scalar = float;
  using C = simd::Bits;
  using Bytes = uint8_t __attribute__((vector_size(simd::kLanes)));
  static constexpr int64_t kCount = simd::kLanes;
  static V load(const T* p, int64_t count) { return simd::load_upto(p, count); }
  static void store(T* p, V v, int64_t count) { simd::store_upto(p, v, count); }
  static C load_codes(const uint8_t* p, int64_t count) {
    Bytes bytes{};
    std::memcpy(&bytes, p, count);
    return __builtin_convertvector(bytes, C);
  }
  static void store_codes(uint8_t* p, C codes, int64_t count) {
    const Bytes bytes = __builtin_convertvector(codes, Bytes);
    std::memcpy(p, &bytes, count);
  }
};

template <>
struct Lanes<double> {
  using V = double;
  using Scalar = double;
  using C = uint32_t;
  static constexpr int64_t kCount = 1;
  static V load(const double* p, int64_t) { return *p; }
  static void store(double* p, V v, int64_t) { *p = v; }
  static C load_codes(const uint8_t* p, int64_t) { return *p; }
  static void store_codes(uint8_t* p, C codes, int64_t) { *p = static_cast<uint8_t>(codes); }
};

// dropout(relu(v)) as at::relu (v < 0 becomes 0; NaN and -0 stay) then times the noise (the
// kept value where `codes` holds kKeptByDropout, else 0), and the codes with kPassedByRelu where
// relu's gradient passes (v not <= 0). The same expressions on a float vector and on a double.
template <bool kRelu, typename V, typename C>
__attribute__((always_inline)) inline V dropout_value(V v, C& codes, V kept) {
  V r = v;
  if constexpr (kRelu) {
    r = v < 0 ? V{} : v;
    codes = codes | (v <= 0 ? C{} : C{} + kPassedByRelu);
  }
  return r * ((codes & kKeptByDropout) != 0 ? kept : V{});
}

// dz = threshold_backward(dy noise, r, 0): dy times the noise where relu passes it, else 0.
template <bool kRelu, typename V, typename C>
__attribute__((always_inline)) inline V dropout_gradient(V dy, C codes, V kept) {
  const V dz = dy * ((codes & kKeptByDropout) != 0 ? kept : V{});
  if constexpr (kRelu) return (codes & kPassedByRelu) != 0 ? dz : V{};
  return dz;
}

// z [n] <- dropout(relu(z)) (or dropout(z)) in place, codes [n] (dropout's flags) completed.
template <bool kRelu, typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void dropout_forward_span(T* z, uint8_t* codes,
                                                                                                int64_t n, double kept) {
  using L = Lanes<T>;
  const typename L::V kept_lanes = typename L::V{} + static_cast<typename L::Scalar>(kept);
  for (int64_t i = 0; i < n; i += L::kCount) {
    const int64_t count = std::min(L::kCount, n - i);
    typename L::C code = L::load_codes(codes + i, count);
    L::store(z + i, dropout_value<kRelu>(L::load(z + i, count), code, kept_lanes), count);
    L::store_codes(codes + i, code, count);
  }
}

// dz [n] from dy [n] and the codes.
template <bool kRelu, typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void dropout_backward_span(
    const T* dy, const uint8_t* codes, T* dz, int64_t n, double kept) {
  using L = Lanes<T>;
  const typename L::V kept_lanes = typename L::V{} + static_cast<typename L::Scalar>(kept);
  for (int64_t i = 0; i < n; i += L::kCount) {
    const int64_t count = std::min(L::kCount, n - i);
    L::store(dz + i, dropout_gradient<kRelu>(L::load(dy + i, count), L::load_codes(codes + i, count), kept_lanes),
             count);
  }
}

// fn(relu) with relu as a std::bool_constant, a compile-time constant.
template <typename Fn>
void with_relu(bool relu, const Fn& fn) {
  if (relu) return fn(std::true_type{});
  fn(std::false_type{});
}

// Dropout (after relu where asked) applied in place to y [M, N] (contiguous, ours); returns the codes.
torch::Tensor apply_dropout(torch::Tensor& y, const ActiveEpilogue& e) {
  // p = 1 keeps nothing and, as aten::dropout, draws nothing.
  torch::Tensor codes = e.keep == 0 ? at::zeros(y.sizes(), at::kByte) : dropout_keep_flags(y.sizes(), e.keep);
  const double kept = dropout_kept_value(y.scalar_type(), e.keep).item<double>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, y.scalar_type(), "low_rank_dropout", [&] {
    scalar_t* z = y.data_ptr<scalar_t>();
    uint8_t* code = codes.data_ptr<uint8_t>();
    with_relu(e.relu, [&](auto relu) {
      at::parallel_for(0, y.numel(), kEpilogueGrain, [&](int64_t begin, int64_t end) {
        dropout_forward_span<decltype(relu)::value>(z + begin, code + begin, end - begin, kept);
      });
    });
  });
  return codes;
}

// dz from dy and the codes.
torch::Tensor dropout_backward(const torch::Tensor& dy, const torch::Tensor& codes, const ActiveEpilogue& e) {
  const torch::Tensor g = dy.contiguous();
  torch::Tensor dz = at::empty_like(g);
  const double kept = dropout_kept_value(g.scalar_type(), e.keep).item<double>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, g.scalar_type(), "low_rank_dropout_backward", [&] {
    const scalar_t* in = g.data_ptr<scalar_t>();
    const uint8_t* code = codes.data_ptr<uint8_t>();
    scalar_t* out = dz.data_ptr<scalar_t>();
    with_relu(e.relu, [&](auto relu) {
      at::parallel_for(0, g.numel(), kEpilogueGrain, [&](int64_t begin, int64_t end) {
        dropout_backward_span<decltype(relu)::value>(in + begin, code + begin, out + begin, end - begin, kept);
      });
    });
  });
  return dz;
}

// The forward in LibTorch's ops, differentiable, with dropout's noise from the codes.
torch::Tensor unfused_low_rank(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                               const torch::Tensor& bias, double scale, const torch::Tensor& codes,
                               const ActiveEpilogue& e) {
  const torch::Tensor projected = at::mm(x, a) * scale;
  torch::Tensor y = bias.defined() ? at::addmm(bias, projected, b) : at::mm(projected, b);
  if (e.relu) y = at::relu(y);
  if (!e.dropout) return y;
  const torch::Tensor kept = dropout_kept_value(y.scalar_type(), e.keep);
  return y * at::where(codes.bitwise_and(kKeptByDropout).to(at::kBool), kept, at::zeros({}, kept.options()));
}

// y = E(P b + bias) with P = scale x a and E the epilogue. With g = dL/dy, dz = E'(g) (the codes'
// mask and noise) and D = scale dz b^T: dL/db = P^T dz, dL/da = x^T D, dL/dx = D a^T, dL/dbias =
// sum over rows of dz. Under create_graph, LibTorch's autograd of the same ops (unfused_low_rank).
struct LowRankLinearFunction : torch::autograd::Function<LowRankLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& a,
                               const torch::Tensor& b, const c10::optional<torch::Tensor>& bias, double scale,
                               bool relu, bool dropout, double keep) {
    torch::Tensor projected = kernels::mm(x, a).mul_(scale);
    torch::Tensor y = bias ? kernels::addmm(*bias, projected, b) : kernels::mm(projected, b);
    const ActiveEpilogue e{relu, dropout, keep};
    torch::Tensor codes, relu_output;
    if (dropout) {
      y = y.contiguous();
      codes = apply_dropout(y, e);
    } else if (relu) {
      relu_output = y.relu_();  // at::relu's bits; threshold_backward reads it, as for at::relu
    }
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["keep"] = keep;
    ctx->save_for_backward({x, a, b, projected, codes, bias.value_or(torch::Tensor()), relu_output});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &a = saved[1], &b = saved[2], &projected = saved[3], &codes = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    const ActiveEpilogue e{ctx->saved_data["relu"].toBool(), ctx->saved_data["dropout"].toBool(),
                           ctx->saved_data["keep"].toDouble()};
    if (torch::GradMode::is_enabled()) {  // create_graph: LibTorch's ops, differentiable in turn
      auto grads = gradients_of(unfused_low_rank(x, a, b, saved[5], scale, codes, e), {x, a, b, saved[5]},
                                grad_outputs[0]);
      grads.resize(8);
      return grads;
    }
    const torch::Tensor &relu_output = saved[6];
    const torch::Tensor g = codes.defined()         ? dropout_backward(grad_outputs[0], codes, e)
                            : relu_output.defined() ? at::threshold_backward(grad_outputs[0], relu_output, 0)
                                                    : grad_outputs[0].contiguous();
    torch::Tensor grad_bias;
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(3)) grad_bias = g.sum(0);
    torch::Tensor grad_x, grad_a, grad_b;
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      const torch::Tensor d = kernels::mm(g, b.t()).mul_(scale);
      if (ctx->needs_input_grad(0)) grad_x = kernels::mm(d, a.t());
      if (ctx->needs_input_grad(1)) grad_a = kernels::mm(x.t(), d);
    }
    if (ctx->needs_input_grad(2)) grad_b = kernels::mm(projected.t(), g);
    return {grad_x, grad_a, grad_b, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

void check_shapes(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bias) {
  auto fail = [&](const char* operand, const std::string& expected, const torch::Tensor& got) {
    throw UsageError(std::string("low_rank_linear ") + operand,
                     fmt::format("expected {}, got {}", expected, got.defined() ? c10::str(got.sizes()) : "undefined"));
  };
  if (!a.defined() || a.dim() != 2) fail("a", "[K, R]", a);
  if (!b.defined() || b.dim() != 2 || b.size(0) != a.size(1)) fail("b", fmt::format("[{}, N]", a.size(1)), b);
  if (!x.defined() || x.dim() != 2 || x.size(1) != a.size(0)) fail("x", fmt::format("[M, {}]", a.size(0)), x);
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != b.size(1))) fail("bias", fmt::format("[{}]", b.size(1)), bias);
}

}  // namespace

torch::Tensor low_rank_linear(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                              const torch::Tensor& bias, double scale, const LowRankEpilogue& epilogue) {
  check_shapes(x, a, b, bias);
  if (!(epilogue.dropout() >= 0 && epilogue.dropout() <= 1)) {
    throw UsageError("low_rank_linear dropout", fmt::format("must be between 0 and 1, got {}", epilogue.dropout()));
  }
  const ActiveEpilogue e = active(epilogue);
  const auto optional_bias = bias.defined() ? c10::make_optional(autocast_argument(bias)) : c10::nullopt;
  return LowRankLinearFunction::apply(autocast_argument(x), autocast_argument(a), autocast_argument(b), optional_bias,
                                      scale, e.relu, e.dropout, e.keep);
}

}  // namespace afterburner::kernels
