#include "afterburner/kernels/gelu.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cstring>

#include "simd.h"

namespace afterburner::kernels {
namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;       // 1 / sqrt(2)
constexpr float kNormalDensity = 0.39894228040143268f;  // 1 / sqrt(2 pi)
constexpr int64_t kGeluGrain = 32768;                   // elements per parallel task, at least

// erf(z) on every lane as LibTorch's CPU vectors compute it (Abramowitz and Stegun 7.1.26,
// absolute error below 1.5e-7): sign(z) (1 - t r(t) exp(-z^2)), t = 1 / (1 + 0.3275911 |z|), r a
// quartic in t; `gauss` is exp(-z^2).
__attribute__((always_inline)) inline simd::Vec erf_lanes(simd::Vec z, simd::Vec gauss) {
  using Bits = simd::UintsOf<simd::Vec>::type;
  Bits bits;
  std::memcpy(&bits, &z, sizeof bits);
  const Bits sign = bits & 0x80000000u;
  const Bits magnitude_bits = bits ^ sign;
  simd::Vec magnitude;
  std::memcpy(&magnitude, &magnitude_bits, sizeof magnitude);
  const simd::Vec t = 1.0f / (0.3275911f * magnitude + 1.0f);
  simd::Vec r = 1.061405429f * t + -1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t + -0.284496736f;
  r = r * t + 0.254829592f;
  const simd::Vec e = (-gauss * t) * r + 1.0f;
  Bits e_bits;
  std::memcpy(&e_bits, &e, sizeof e_bits);
  e_bits ^= sign;
  simd::Vec signed_e;
  std::memcpy(&signed_e, &e_bits, sizeof signed_e);
  return signed_e;
}

// dx = dy (Phi(x) + x phi(x)): Phi(x) = (1 + erf(z)) / 2 and phi(x) = exp(-z^2) / sqrt(2 pi) for
// z = x / sqrt(2), one exponential for both.
__attribute__((always_inline)) inline simd::Vec gelu_gradient_lanes(simd::Vec dy, simd::Vec x) {
  const simd::Vec z = x * kSqrtHalf;
  const simd::Vec gauss = simd::exp_nonpositive(-(z * z));
  const simd::Vec cdf = 0.5f * (1.0f + erf_lanes(z, gauss));
  return dy * (cdf + x * (gauss * kNormalDensity));
}

template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void gelu_gradient_span(const T* dy, const T* x,
                                                                                             T* dx, int64_t n) {
  int64_t i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) {
    simd::store(dx + i, gelu_gradient_lanes(simd::load(dy + i), simd::load(x + i)));
  }
  if (i < n) {
    const simd::Vec last = gelu_gradient_lanes(simd::load_partial(dy + i, n - i), simd::load_partial(x + i, n - i));
    simd::store_partial(dx + i, last, n - i);
  }
}

// Whether the gradient for `dy` and `x` is ours: float or bf16 CPU tensors of one dtype and shape.
bool gradient_here(const torch::Tensor& dy, const torch::Tensor& x) {
  return x.device().is_cpu() && x.layout() == at::kStrided && dy.layout() == at::kStrided &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && dy.scalar_type() == x.scalar_type() &&
         dy.sizes() == x.sizes();
}

// dy and x as flat spans where they are dense alike: a dense tensor's storage order is an order of
// its elements, the same in every dense tensor of its strides (empty_like keeps them).
torch::Tensor gelu_gradient(const torch::Tensor& dy, const torch::Tensor& x) {
  const bool flat = x.is_non_overlapping_and_dense() && dy.strides() == x.strides();
  const torch::Tensor grad = flat ? dy : dy.contiguous();
  const torch::Tensor input = flat ? x : x.contiguous();
  torch::Tensor dx = at::empty_like(input);
  const int64_t n = input.numel();
  if (input.scalar_type() == at::kBFloat16) {
    const auto *g = grad.data_ptr<c10::BFloat16>(), *v = input.data_ptr<c10::BFloat16>();
    auto* to = dx.data_ptr<c10::BFloat16>();
    at::parallel_for(0, n, kGeluGrain, [&](int64_t b, int64_t e) { gelu_gradient_span(g + b, v + b, to + b, e - b); });
  } else {
    const float *g = grad.data_ptr<float>(), *v = input.data_ptr<float>();
    float* to = dx.data_ptr<float>();
    at::parallel_for(0, n, kGeluGrain, [&](int64_t b, int64_t e) { gelu_gradient_span(g + b, v + b, to + b, e - b); });
  }
  return dx;
}

struct GeluFunction : torch::autograd::Function<GeluFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->save_for_backward({x});
    return at::gelu(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor& dy = grad_outputs[0];
    // Under create_graph, LibTorch's gelu_backward: differentiable in turn.
    if (at::GradMode::is_enabled() || !gradient_here(dy, x)) return {at::gelu_backward(dy, x)};
    return {gelu_gradient(dy, x)};
  }
};

}  // namespace

torch::Tensor gelu(const torch::Tensor& x) { return GeluFunction::apply(x); }

}  // namespace afterburner::kernels
