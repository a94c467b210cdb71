#include "afterburner/kernels/layer_norm.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "afterburner/core/error.h"
#include "simd.h"

namespace afterburner::kernels {
namespace {

// Rows per parallel task, and per partial sum of the weight's and bias's gradients.
constexpr int64_t kNormRowsPerBlock = 64;

// The lanes' sum, halving: four dependent additions rather than fifteen.
__attribute__((always_inline)) inline float sum_of_lanes(simd::Vec v) {
  const auto eight = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const auto four =
      __builtin_shufflevector(eight, eight, 0, 1, 2, 3) + __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
  const auto two = __builtin_shufflevector(four, four, 0, 1) + __builtin_shufflevector(four, four, 2, 3);
  return two[0] + two[1];
}

// 1 in the first `lanes` lanes, 0 in the others.
__attribute__((always_inline)) inline simd::Vec first_lanes(int64_t lanes) {
  simd::Vec mask{};
  for (int64_t i = 0; i < lanes; ++i) mask[i] = 1.0f;
  return mask;
}

// y = (x - mean) rstd weight + bias, per row of x [rows, d], with mean = sum(x) / d and
// rstd = 1 / sqrt(sum((x - mean)^2) / d + eps) (two passes over the row), kept per row. The row's
// whole 16-lane blocks, then a tail of d mod 16 values.
template <typename T, typename Out>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void normalize_rows(
    const T* x, const float* weight, const float* bias, int64_t rows, int64_t d, float eps, Out* y, float* mean,
    float* rstd) {
  const int64_t full = d / simd::kLanes * simd::kLanes, tail = d - full;
  const simd::Vec tail_mask = first_lanes(tail);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * d;
    simd::Vec sum{};
    for (int64_t c = 0; c < full; c += simd::kLanes) sum += simd::load(row + c);
    if (tail) sum += simd::load_partial(row + full, tail);
    const float m = sum_of_lanes(sum) / d;
    simd::Vec squares{};
    for (int64_t c = 0; c < full; c += simd::kLanes) {
      const simd::Vec deviation = simd::load(row + c) - m;
      squares += deviation * deviation;
    }
    if (tail) {
      const simd::Vec deviation = (simd::load_partial(row + full, tail) - m) * tail_mask;
      squares += deviation * deviation;
    }
    const float s = 1.0f / std::sqrt(sum_of_lanes(squares) / d + eps);
    mean[r] = m;
    rstd[r] = s;
    Out* out = y + r * d;
    for (int64_t c = 0; c < full; c += simd::kLanes) {
      simd::store(out + c, (simd::load(row + c) - m) * s * simd::load(weight + c) + simd::load(bias + c));
    }
    if (tail) {
      const simd::Vec v = (simd::load_partial(row + full, tail) - m) * s * simd::load_partial(weight + full, tail) +
                          simd::load_partial(bias + full, tail);
      simd::store_partial(out + full, v, tail);
    }
  }
}

// One row's gradient terms at 16 columns: g = dy weight and xhat = (x - mean) rstd.
struct Terms {
  simd::Vec dy, g, xhat;
};

template <bool whole, typename T>
__attribute__((always_inline)) inline Terms terms_at(const float* dy, const T* x, const float* weight, float m, float s,
                                                     int64_t lanes) {
  const simd::Vec dyv = simd::load<whole>(dy, lanes);
  return {dyv, dyv * simd::load<whole>(weight, lanes), (simd::load<whole>(x, lanes) - m) * s};
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) per row; dy xhat and dy added into dweight and
// dbias [d] (where not null). Lanes past a row read 0 from dy, so g = 0 there.
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void normalize_rows_backward(
    const float* dy, const T* x, const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t d,
    T* dx, float* dweight, float* dbias) {
  const int64_t full = d / simd::kLanes * simd::kLanes, tail = d - full;
  for (int64_t r = 0; r < rows; ++r) {
    const float* grad = dy + r * d;
    const T* row = x + r * d;
    const float m = mean[r], s = rstd[r];
    simd::Vec sum_g{}, sum_g_xhat{};
    const auto accumulate = [&](const Terms& t, int64_t c, int64_t lanes) __attribute__((always_inline)) {
      sum_g += t.g;
      sum_g_xhat += t.g * t.xhat;
      if (dweight) simd::store_upto(dweight + c, simd::load_upto(dweight + c, lanes) + t.dy * t.xhat, lanes);
      if (dbias) simd::store_upto(dbias + c, simd::load_upto(dbias + c, lanes) + t.dy, lanes);
    };
    for (int64_t c = 0; c < full; c += simd::kLanes) {
      accumulate(terms_at<true>(grad + c, row + c, weight + c, m, s, simd::kLanes), c, simd::kLanes);
    }
    if (tail) accumulate(terms_at<false>(grad + full, row + full, weight + full, m, s, tail), full, tail);
    const float mean_g = sum_of_lanes(sum_g) / d, mean_g_xhat = sum_of_lanes(sum_g_xhat) / d;
    T* out = dx + r * d;
    for (int64_t c = 0; c < full; c += simd::kLanes) {
      const Terms t = terms_at<true>(grad + c, row + c, weight + c, m, s, simd::kLanes);
      simd::store(out + c, s * (t.g - mean_g - t.xhat * mean_g_xhat));
    }
    if (tail) {
      const Terms t = terms_at<false>(grad + full, row + full, weight + full, m, s, tail);
      simd::store_partial(out + full, s * (t.g - mean_g - t.xhat * mean_g_xhat), tail);
    }
  }
}

// `body(T{})` with T the element type of x: float or bf16.
template <typename Body>
void with_element_type(const torch::Tensor& x, const Body& body) {
  if (x.scalar_type() == at::kBFloat16) {
    body(c10::BFloat16{});
  } else {
    body(float{});
  }
}

// The weight (in fp32), or ones where there is none; the bias, or zeros: the kernels take both.
torch::Tensor weight_or_ones(const torch::Tensor& weight, int64_t d) {
  return weight.defined() ? weight.to(at::kFloat).contiguous() : at::ones({d}, at::kFloat);
}

torch::Tensor bias_or_zeros(const c10::optional<torch::Tensor>& bias, int64_t d) {
  return bias ? bias->to(at::kFloat).contiguous() : at::zeros({d}, at::kFloat);
}

bool autocast_in_bf16() {
  return at::autocast::is_cpu_enabled() && at::autocast::get_autocast_cpu_dtype() == at::kBFloat16;
}

// Autocast's policy: fp32 (LibTorch would copy a bf16 input to fp32 first), or bf16 where the
// readers would cast it so; outside autocast the input's dtype, as aten::layer_norm's.
at::ScalarType result_type(const torch::Tensor& x, bool bf16_for_autocast) {
  if (!autocast_in_bf16()) return x.scalar_type();
  return bf16_for_autocast ? at::kBFloat16 : at::kFloat;
}

// `body(first_row, rows, block)` for each block of kNormRowsPerBlock rows of `total`, in parallel.
template <typename Body>
void for_row_blocks(int64_t total, const Body& body) {
  const int64_t blocks = (total + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kNormRowsPerBlock;
      body(first, std::min(kNormRowsPerBlock, total - first), b);
    }
  });
}

// y (of result_type) and each row's mean and rstd for x (contiguous) over its last d values.
void normalize(const torch::Tensor& x, int64_t d, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
               double eps, bool bf16_for_autocast, torch::Tensor& y, torch::Tensor& mean, torch::Tensor& rstd) {
  const int64_t rows = x.numel() / d;
  y = at::empty(x.sizes(), x.options().dtype(result_type(x, bf16_for_autocast)));
  mean = at::empty({rows}, x.options().dtype(at::kFloat));
  rstd = at::empty({rows}, mean.options());
  const torch::Tensor scale = weight_or_ones(weight, d), shift = bias_or_zeros(bias, d);
  with_element_type(x, [&](auto in_tag) {
    with_element_type(y, [&](auto out_tag) {
      using T = decltype(in_tag);
      using Out = decltype(out_tag);
      for_row_blocks(rows, [&](int64_t first, int64_t count, int64_t) {
        normalize_rows(x.data_ptr<T>() + first * d, scale.data_ptr<float>(), shift.data_ptr<float>(), count, d,
                       static_cast<float>(eps), y.data_ptr<Out>() + first * d, mean.data_ptr<float>() + first,
                       rstd.data_ptr<float>() + first);
      });
    });
  });
}

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               std::vector<int64_t> normalized_shape, const c10::optional<torch::Tensor>& weight,
                               const c10::optional<torch::Tensor>& bias, double eps, bool bf16_for_autocast) {
    const torch::Tensor x = x_in.contiguous();
    torch::Tensor y, mean, rstd;
    normalize(x, c10::multiply_integers(normalized_shape), weight.value_or(torch::Tensor()), bias, eps,
              bf16_for_autocast, y, mean, rstd);
    ctx->save_for_backward({x, weight.value_or(torch::Tensor()), mean, rstd});
    ctx->saved_data["has_bias"] = bias.has_value();
    if (bias) ctx->saved_data["bias_type"] = bias->scalar_type();
    ctx->saved_data["normalized_shape"] = normalized_shape;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    if (at::GradMode::is_enabled()) {
      throw UsageError("layer_norm", "second-order gradients (create_graph) are not supported by afterburner's "
                                     "layer_norm");
    }
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const torch::Tensor dy = grad_outputs[0].to(at::kFloat).contiguous();
    const int64_t rows = mean.numel(), d = x.numel() / std::max<int64_t>(rows, 1);
    const int64_t blocks = (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
    const bool weight_grad = weight.defined() && ctx->needs_input_grad(1);  // x, weight, bias: edges 0, 1, 2
    const bool bias_grad = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(weight.defined() ? 2 : 1);
    // Per block of rows, its sums of dy xhat and dy; summed below in block order.
    torch::Tensor partials = at::zeros({blocks, 2, d}, dy.options());
    torch::Tensor dx = at::empty_like(x);
    const torch::Tensor scale = weight_or_ones(weight, d);
    with_element_type(x, [&](auto tag) {
      using T = decltype(tag);
      const T* from = x.data_ptr<T>();
      for_row_blocks(rows, [&](int64_t first, int64_t count, int64_t block) {
        float* sums = partials.data_ptr<float>() + block * 2 * d;
        normalize_rows_backward(dy.data_ptr<float>() + first * d, from + first * d, scale.data_ptr<float>(),
                                mean.data_ptr<float>() + first, rstd.data_ptr<float>() + first, count, d,
                                dx.data_ptr<T>() + first * d, weight_grad ? sums : nullptr,
                                bias_grad ? sums + d : nullptr);
      });
    });
    torch::Tensor dweight, dbias;
    if (weight_grad || bias_grad) {
      const torch::Tensor totals = at::zeros({2, d}, dy.options());
      float* total = totals.data_ptr<float>();
      const float* part = partials.data_ptr<float>();
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t i = 0; i < 2 * d; ++i) total[i] += part[b * 2 * d + i];
      }
      const std::vector<int64_t> shape = ctx->saved_data["normalized_shape"].toIntVector();
      // In the parameters' own dtype (bf16 ones get their fp32 sums rounded once).
      if (weight_grad) dweight = totals[0].view(shape).to(weight.scalar_type());
      if (bias_grad) dbias = totals[1].view(shape).to(ctx->saved_data["bias_type"].toScalarType());
    }
    return {dx, {}, dweight, dbias, {}, {}};
  }
};

bool taken_here(const torch::Tensor& x, at::IntArrayRef normalized_shape, const torch::Tensor& weight,
                const torch::Tensor& bias) {
  const auto fp32_or_bf16 = [](const torch::Tensor& t) {
    return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
  };
  const auto affine = [&](const torch::Tensor& t) {
    return !t.defined() || (fp32_or_bf16(t) && t.sizes() == normalized_shape && t.device().is_cpu());
  };
  const int64_t dims = static_cast<int64_t>(normalized_shape.size());
  return fp32_or_bf16(x) && x.device().is_cpu() && x.layout() == at::kStrided && x.numel() > 0 && dims >= 1 &&
         x.dim() >= dims && x.sizes().slice(x.dim() - dims) == normalized_shape && affine(weight) && affine(bias);
}

bool records_for_autograd(std::initializer_list<torch::Tensor> tensors) {
  const auto records = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  return at::GradMode::is_enabled() && std::any_of(tensors.begin(), tensors.end(), records);
}

}  // namespace

torch::Tensor layer_norm(const torch::Tensor& x, at::IntArrayRef normalized_shape, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps, bool bf16_for_autocast) {
  if (!taken_here(x, normalized_shape, weight, bias)) return at::layer_norm(x, normalized_shape, weight, bias, eps);
  const auto optional = [](const torch::Tensor& t) { return t.defined() ? c10::make_optional(t) : c10::nullopt; };
  if (!records_for_autograd({x, weight, bias})) {  // inference: no statistics kept, no autograd node
    torch::Tensor y, mean, rstd;
    normalize(x.contiguous(), c10::multiply_integers(normalized_shape), weight, optional(bias), eps,
              bf16_for_autocast, y, mean, rstd);
    return y;
  }
  return LayerNormFunction::apply(x, normalized_shape.vec(), optional(weight), optional(bias), eps,
                                  bf16_for_autocast);
}

}  // namespace afterburner::kernels
