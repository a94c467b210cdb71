#include "afterburner/kernels/cross_entropy.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "afterburner/core/error.h"
#include "exp_nonpositive.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_inputs(const torch::Tensor& logits, const torch::Tensor& target) {
  if (!logits.defined() || logits.dim() != 2) {
    throw UsageError("cross_entropy logits",
                     "expected [rows, classes], got " + (logits.defined() ? c10::str(logits.sizes()) : "undefined"));
  }
  const auto dtype = logits.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kBFloat16) {
    throw UsageError("cross_entropy logits",
                     std::string("dtype ") + c10::toString(dtype) + " is not supported (float, double or bfloat16)");
  }
  if (!target.defined() || target.dim() != 1 || target.size(0) != logits.size(0) ||
      target.scalar_type() != at::kLong) {
    throw UsageError("cross_entropy target", "expected int64 [" + std::to_string(logits.size(0)) + "] for logits " +
                                                 c10::str(logits.sizes()) + ", got " +
                                                 (target.defined() ? std::string(c10::toString(target.scalar_type())) +
                                                                         " " + c10::str(target.sizes())
                                                                   : "undefined"));
  }
  if (!logits.device().is_cpu() || !target.device().is_cpu()) {
    throw UsageError("cross_entropy", "CPU tensors only, got logits on " + c10::str(logits.device()) +
                                          " and target on " + c10::str(target.device()));
  }
}

int64_t checked_target(int64_t value, int64_t row, int64_t classes) {
  if (value < 0 || value >= classes) {
    throw UsageError("cross_entropy target", "value " + std::to_string(value) + " at row " + std::to_string(row) +
                                                 " is out of range for " + std::to_string(classes) + " classes");
  }
  return value;
}

// torch's own choice under CPU autocast: cross-entropy of bf16 logits runs (and returns) in float.
at::ScalarType loss_dtype(const torch::Tensor& logits) {
  const bool reduced = logits.scalar_type() == at::kBFloat16;
  return reduced && at::autocast::is_cpu_enabled() ? at::kFloat : logits.scalar_type();
}

// About GRAIN_SIZE logits per parallel task, so that small batches stay on one thread.
int64_t rows_per_task(int64_t classes) {
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, classes));
}

// lse = log sum_j exp(row_j) in one pass: a running max m and s = sum_j exp(row_j - m), scaled by
// exp(m_old - m_new) whenever the max grows, so no exp overflows.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
acc_t online_logsumexp(const scalar_t* row, int64_t classes) {
  constexpr acc_t minus_infinity = -std::numeric_limits<acc_t>::infinity();
  acc_t max = minus_infinity;
  acc_t sum = 0;
  for (int64_t j = 0; j < classes; ++j) {
    const acc_t value = row[j];
    if (value > max) {
      sum = sum * std::exp(max - value) + 1;
      max = value;
    } else if (value != minus_infinity) {  // -inf adds nothing (and -inf - -inf is NaN); NaN still propagates
      sum += std::exp(value - max);
    }
  }
  return max + std::log(sum);
}

// bf16 <-> float by their bits (bf16 is the top half of a float, rounded to nearest even as
// c10::BFloat16 does, NaN kept NaN): plain integer code that vectorizes, unlike the c10 conversions.
inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

template <typename scalar_t>
scalar_t narrow(float v);
template <>
inline float narrow<float>(float v) {
  return v;
}
template <>
inline c10::BFloat16 narrow<c10::BFloat16>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return c10::BFloat16(static_cast<uint16_t>(v != v ? 0x7FC0u : rounded), c10::BFloat16::from_bits());
}

// The same as online_logsumexp for float accumulation, in two vectorized passes: the maximum,
// then sum_j exp(row_j - max). Rows whose maximum is not finite (all -inf or NaN, or a +inf) take
// the one-pass scalar path, which handles them exactly.
template <typename scalar_t>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) float logsumexp_row(const scalar_t* row,
                                                                                        int64_t classes) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < classes; ++j) max = std::max(max, widen(row[j]));
  if (!std::isfinite(max)) return online_logsumexp(row, classes);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < classes; ++j) sum += exp_nonpositive(widen(row[j]) - max);
  return max + std::log(sum);
}

// out_j = (exp(x_j - lse) - [j == target]) * scale for one row, vectorized for float accumulation.
template <typename scalar_t>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void softmax_minus_onehot_row(
    const scalar_t* x, float lse, int64_t target, float scale, scalar_t* out, int64_t classes) {
#pragma omp simd
  for (int64_t j = 0; j < classes; ++j) out[j] = narrow<scalar_t>(exp_nonpositive(widen(x[j]) - lse) * scale);
  out[target] = narrow<scalar_t>((exp_nonpositive(widen(x[target]) - lse) - 1.0f) * scale);
}

// Double logits keep libm's exp: the scalar one-pass forms.
float logsumexp_of_row(const float* row, int64_t classes) { return logsumexp_row(row, classes); }
float logsumexp_of_row(const c10::BFloat16* row, int64_t classes) { return logsumexp_row(row, classes); }
double logsumexp_of_row(const double* row, int64_t classes) { return online_logsumexp(row, classes); }

template <typename scalar_t>
void gradient_of_row(const scalar_t* x, float lse, int64_t target, float scale, scalar_t* out, int64_t classes) {
  softmax_minus_onehot_row(x, lse, target, scale, out, classes);
}

void gradient_of_row(const double* x, double lse, int64_t target, double scale, double* out, int64_t classes) {
  for (int64_t j = 0; j < classes; ++j) out[j] = (std::exp(x[j] - lse) - static_cast<double>(j == target)) * scale;
}

// loss = (1/N) sum_i (lse_i - x[i, t_i]) with lse_i = log sum_j exp(x[i, j]); fills lse per row.
torch::Tensor mean_nll(const torch::Tensor& logits, const torch::Tensor& target, torch::Tensor& logsumexp) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  torch::Tensor loss;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, logits.scalar_type(), "cross_entropy", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    logsumexp = at::empty({rows}, logits.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
    const scalar_t* x = logits.data_ptr<scalar_t>();
    const int64_t* t = target.data_ptr<int64_t>();
    acc_t* lse = logsumexp.data_ptr<acc_t>();
    const auto add_rows = [&](int64_t begin, int64_t end, acc_t partial) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* row = x + i * classes;
        lse[i] = logsumexp_of_row(row, classes);
        partial += lse[i] - static_cast<acc_t>(row[checked_target(t[i], i, classes)]);
      }
      return partial;
    };
    const acc_t total = at::parallel_reduce(0, rows, rows_per_task(classes), acc_t(0), add_rows, std::plus<acc_t>());
    loss = at::scalar_tensor(total / rows, logits.options().dtype(loss_dtype(logits)));
  });
  return loss;
}

// dL/dx[i, j] = (exp(x[i, j] - lse_i) - [j == t_i]) * dL/dloss / N, i.e. (softmax - onehot) scaled.
torch::Tensor mean_nll_gradient(const torch::Tensor& logits, const torch::Tensor& target,
                                const torch::Tensor& logsumexp, const torch::Tensor& grad_loss) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  torch::Tensor grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, logits.scalar_type(), "cross_entropy_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t scale = grad_loss.item<acc_t>() / rows;
    const scalar_t* x = logits.data_ptr<scalar_t>();
    const int64_t* t = target.data_ptr<int64_t>();
    const acc_t* lse = logsumexp.data_ptr<acc_t>();
    scalar_t* out = grad.data_ptr<scalar_t>();
    at::parallel_for(0, rows, rows_per_task(classes), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        gradient_of_row(x + i * classes, lse[i], t[i], scale, out + i * classes, classes);
      }
    });
  });
  return grad;
}

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& target) {
    torch::Tensor logsumexp;
    torch::Tensor loss = mean_nll(logits.contiguous(), target.contiguous(), logsumexp);
    ctx->save_for_backward({logits, target, logsumexp});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    if (torch::GradMode::is_enabled()) return {differentiable_gradient(saved[0], saved[1], grad_outputs[0]), {}};
    const torch::Tensor grad_logits =
        mean_nll_gradient(saved[0].contiguous(), saved[1].contiguous(), saved[2], grad_outputs[0]);
    return {grad_logits, torch::Tensor()};
  }

  // Under create_graph (grad mode on in a backward) the gradient is itself differentiated, which
  // the kernel's result, written through data_ptr, would silently not be: the same formula in
  // LibTorch's ops, (softmax(x) - onehot(t)) dL/dloss / N, accumulated as the kernel does.
  static torch::Tensor differentiable_gradient(const torch::Tensor& logits, const torch::Tensor& target,
                                               const torch::Tensor& grad_loss) {
    const auto dtype = logits.scalar_type() == at::kBFloat16 ? at::kFloat : logits.scalar_type();
    const torch::Tensor onehot = at::one_hot(target, logits.size(1)).to(dtype);
    const torch::Tensor scale = grad_loss.to(dtype) / static_cast<double>(logits.size(0));
    return ((at::softmax(logits, 1, dtype) - onehot) * scale).to(logits.scalar_type());
  }
};

}  // namespace

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& target) {
  check_inputs(logits, target);
  return CrossEntropyFunction::apply(logits, target);
}

}  // namespace afterburner::kernels
