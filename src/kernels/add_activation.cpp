#include "afterburner/kernels/add_activation.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "afterburner/core/error.h"
#include "simd.h"

namespace afterburner::kernels {
namespace {

constexpr int64_t kAddActivationGrain = 32768;  // elements per parallel task, at least

template <typename T>
__attribute__((always_inline)) inline simd::Vec rounded_to(simd::Vec v);

template <>
__attribute__((always_inline)) inline simd::Vec rounded_to<float>(simd::Vec v) {
  return v;
}

// Each lane rounded to bf16 and widened back: the value a bf16 tensor holds.
template <>
__attribute__((always_inline)) inline simd::Vec rounded_to<c10::BFloat16>(simd::Vec v) {
  const simd::Bits bits = simd::bf16_bits(v) << 16;
  simd::Vec out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// y = act(s) for the rounded sum s: relu as clamp_min(s, 0) (NaN and -0 stay), silu as
// s / (1 + exp(-s)), for s < 0 written s t / (1 + t).
template <Activation activation>
__attribute__((always_inline)) inline simd::Vec activated(simd::Vec s) {
  if constexpr (activation == Activation::relu) {
    return s < 0.0f ? simd::Vec{} : s;
  } else {
    return simd::silu(s);
  }
}

// dx = dy where y > 0 (relu, from its output y; NaN passes dy) or dy sig (1 + s (1 - sig)),
// sig = sigmoid(s) (silu, from its input s).
template <Activation activation>
__attribute__((always_inline)) inline simd::Vec activation_gradient(simd::Vec dy, simd::Vec saved) {
  if constexpr (activation == Activation::relu) {
    return saved <= 0.0f ? simd::Vec{} : dy;
  } else {
    const simd::Vec sig = simd::sigmoid_of(saved, simd::exp_of_minus_magnitude(saved));
    return dy * sig * (1.0f + saved * (1.0f - sig));
  }
}

// The sum of lanes [i, i + lanes) as the result's dtype T holds it.
template <typename T, typename A, typename B>
__attribute__((always_inline)) inline simd::Vec rounded_sum(const A* a, const B* b, int64_t i, int64_t lanes) {
  return rounded_to<T>(simd::load_upto(a + i, lanes) + simd::load_upto(b + i, lanes));
}

// y = act(round_T(a + b)) over n elements.
template <Activation activation, typename A, typename B, typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void add_activation_span(const A* a, const B* b,
                                                                                             T* y, int64_t n) {
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    const int64_t lanes = std::min<int64_t>(simd::kLanes, n - i);
    simd::store_upto(y + i, activated<activation>(rounded_sum<T>(a, b, i, lanes)), lanes);
  }
}

// relu's dx from its output y.
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void relu_gradient_span(const T* dy, const T* y,
                                                                                            T* dx, int64_t n) {
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    const int64_t lanes = std::min<int64_t>(simd::kLanes, n - i);
    const simd::Vec g = simd::load_upto(dy + i, lanes), out = simd::load_upto(y + i, lanes);
    simd::store_upto(dx + i, activation_gradient<Activation::relu>(g, out), lanes);
  }
}

// silu's dx from the terms, their sum formed again as the forward formed it: the terms are kept
// for backward in its place, as much memory, and make the gradient differentiable (create_graph).
template <typename A, typename B, typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void silu_gradient_span(const T* dy, const A* a,
                                                                                            const B* b, T* dx,
                                                                                            int64_t n) {
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    const int64_t lanes = std::min<int64_t>(simd::kLanes, n - i);
    const simd::Vec g = simd::load_upto(dy + i, lanes);
    simd::store_upto(dx + i, activation_gradient<Activation::silu>(g, rounded_sum<T>(a, b, i, lanes)), lanes);
  }
}

bool fp32_or_bf16(const torch::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

// Whether a + b is ours: fp32/bf16 CPU tensors of one shape laid out alike and densely, so that
// both (and the result, empty_like keeps the layout) are flat spans in the same element order.
bool fused_here(const torch::Tensor& a, const torch::Tensor& b) {
  return a.device().is_cpu() && b.device().is_cpu() && a.layout() == at::kStrided && b.layout() == at::kStrided &&
         fp32_or_bf16(a) && fp32_or_bf16(b) && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.is_non_overlapping_and_dense();
}

// f(a's data, b's data, a null pointer of the result's element type) for a's and b's dtypes.
template <typename F>
void with_dtypes(const torch::Tensor& a, const torch::Tensor& b, const F& f) {
  using BF16 = c10::BFloat16;
  const bool a_float = a.scalar_type() == at::kFloat, b_float = b.scalar_type() == at::kFloat;
  if (a_float && b_float) return f(a.data_ptr<float>(), b.data_ptr<float>(), static_cast<float*>(nullptr));
  if (a_float) return f(a.data_ptr<float>(), b.data_ptr<BF16>(), static_cast<float*>(nullptr));
  if (b_float) return f(a.data_ptr<BF16>(), b.data_ptr<float>(), static_cast<float*>(nullptr));
  f(a.data_ptr<BF16>(), b.data_ptr<BF16>(), static_cast<BF16*>(nullptr));
}

// A fresh tensor laid out as a, of the dtype a + b has.
torch::Tensor empty_result(const torch::Tensor& a, const torch::Tensor& b) {
  return at::empty_like(a, a.options().dtype(at::promote_types(a.scalar_type(), b.scalar_type())));
}

template <Activation activation>
torch::Tensor add_activation_forward(const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor y = empty_result(a, b);
  with_dtypes(a, b, [&](const auto* a_data, const auto* b_data, auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    T* y_data = y.data_ptr<T>();
    at::parallel_for(0, a.numel(), kAddActivationGrain, [&](int64_t begin, int64_t end) {
      add_activation_span<activation>(a_data + begin, b_data + begin, y_data + begin, end - begin);
    });
  });
  return y;
}

// dy in the layout and dtype of `like` (an upstream gradient can come in any).
torch::Tensor laid_out_as(const torch::Tensor& dy, const torch::Tensor& like) {
  const bool alike = dy.scalar_type() == like.scalar_type() && dy.strides() == like.strides() &&
                     dy.layout() == at::kStrided && dy.is_non_overlapping_and_dense();
  return alike ? dy : at::empty_like(like).copy_(dy);
}

torch::Tensor relu_gradient(const torch::Tensor& dy, const torch::Tensor& y) {
  const torch::Tensor upstream = laid_out_as(dy, y);
  torch::Tensor dx = at::empty_like(y);
  const auto run = [&](const auto* type) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(type)>>;
    const T *g = upstream.data_ptr<T>(), *out = y.data_ptr<T>();
    T* to = dx.data_ptr<T>();
    at::parallel_for(0, dx.numel(), kAddActivationGrain, [&](int64_t begin, int64_t end) {
      relu_gradient_span(g + begin, out + begin, to + begin, end - begin);
    });
  };
  if (y.scalar_type() == at::kFloat) {
    run(static_cast<const float*>(nullptr));
  } else {
    run(static_cast<const c10::BFloat16*>(nullptr));
  }
  return dx;
}

torch::Tensor silu_gradient(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor dx = empty_result(a, b);
  const torch::Tensor upstream = laid_out_as(dy, dx);
  with_dtypes(a, b, [&](const auto* a_data, const auto* b_data, auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const T* g = upstream.data_ptr<T>();
    T* to = dx.data_ptr<T>();
    at::parallel_for(0, dx.numel(), kAddActivationGrain, [&](int64_t begin, int64_t end) {
      silu_gradient_span(g + begin, a_data + begin, b_data + begin, to + begin, end - begin);
    });
  });
  return dx;
}

// The gradients in LibTorch's differentiable ops (create_graph): relu's as its own backward,
// silu's as eager autograd differentiates it (sigmoid and its product, s formed again).
torch::Tensor differentiable_gradient(const torch::Tensor& dy, Activation activation,
                                      const torch::autograd::variable_list& saved) {
  if (activation == Activation::relu) return at::threshold_backward(dy, saved[0], 0);
  const torch::Tensor s = at::add(saved[0], saved[1]);
  const torch::Tensor sigmoid = at::sigmoid(s);
  return dy * sigmoid * (1 + s * (1 - sigmoid));
}

// LibTorch's ops for what the kernel does not take.
torch::Tensor activate(const torch::Tensor& s, Activation activation) {
  return activation == Activation::relu ? at::relu(s) : at::silu(s);
}

// Keeps relu's output, or silu's two terms, for the gradient.
struct AddActivationFunction : torch::autograd::Function<AddActivationFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               int64_t activation_index) {
    ctx->saved_data["activation"] = activation_index;
    if (static_cast<Activation>(activation_index) == Activation::silu) {
      ctx->save_for_backward({a, b});
      return add_activation_forward<Activation::silu>(a, b);
    }
    torch::Tensor y = add_activation_forward<Activation::relu>(a, b);
    ctx->save_for_backward({y});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto activation = static_cast<Activation>(ctx->saved_data["activation"].toInt());
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& dy = grad_outputs[0];
    torch::Tensor dx;
    if (at::GradMode::is_enabled()) {
      dx = differentiable_gradient(dy, activation, saved);
    } else if (activation == Activation::relu) {
      dx = relu_gradient(dy, saved[0]);
    } else {
      dx = silu_gradient(dy, saved[0], saved[1]);
    }
    return {dx, dx, torch::Tensor()};
  }
};

}  // namespace

Activation activation_named(const std::string& name, const std::string& field) {
  if (name == "relu") return Activation::relu;
  if (name == "silu") return Activation::silu;
  throw UsageError(field, "unknown activation '" + name + "', expected relu or silu");
}

torch::Tensor add_activation(const torch::Tensor& a, const torch::Tensor& b, Activation activation) {
  if (!fused_here(a, b)) return activate(at::add(a, b), activation);
  return AddActivationFunction::apply(a, b, static_cast<int64_t>(activation));
}

}  // namespace afterburner::kernels
