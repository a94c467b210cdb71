#include "afterburner/kernels/favor.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "afterburner/core/error.h"
#include "afterburner/kernels/gemm.h"
#include "exp_nonpositive.h"
#include "gradients_of.h"
#include "simd.h"

namespace afterburner::kernels {
namespace {

// Added to every feature, as Panther (and Performer) do, so that no normaliser is exactly 0.
constexpr double kFeatureStabilizer = 1e-5;
constexpr int64_t kFavorRowGrain = 64;  // rows per parallel task, at least

bool is_softmax(FavorFeatureMap map) { return map != FavorFeatureMap::relu; }

// What x is multiplied by before its projection: d^-1/4 for softmax features, m^-1/2 for ReLU.
double projection_scale(FavorFeatureMap map, int64_t dim, int64_t features) {
  return is_softmax(map) ? std::pow(static_cast<double>(dim), -0.25) : 1.0 / std::sqrt(static_cast<double>(features));
}

// The features as LibTorch's ops compute them: their definition, and the path under create_graph.
torch::Tensor unfused_features(const torch::Tensor& x, const torch::Tensor& projection, FavorFeatureMap map) {
  const double scale = projection_scale(map, x.size(-1), projection.size(0));
  const torch::Tensor dash = torch::matmul(x, (projection * scale).t());
  if (!is_softmax(map)) return torch::relu(dash) + kFeatureStabilizer;
  const torch::Tensor half_norm = x.square().sum(-1, /*keepdim=*/true) * (scale * scale / 2);
  torch::Tensor stabilizer = dash.amax(-1, /*keepdim=*/true);
  if (map == FavorFeatureMap::softmax_key) stabilizer = stabilizer.amax(-2, /*keepdim=*/true);
  return torch::exp(dash - (half_norm + stabilizer)) + kFeatureStabilizer;
}

torch::Tensor unfused_contraction(const torch::Tensor& qf, const torch::Tensor& kf, const torch::Tensor& values) {
  const torch::Tensor numerator = torch::matmul(qf, torch::matmul(kf.transpose(-2, -1), values));
  const torch::Tensor normaliser = torch::matmul(qf, kf.sum(-2).unsqueeze(-1));
  return numerator / normaliser.masked_fill(normaliser == 0, 1);
}

void check_dtype(const torch::Tensor& t, const char* field) {
  if (t.scalar_type() != torch::kFloat && t.scalar_type() != torch::kDouble) {
    throw UsageError(field, fmt::format("expected float or double, got {}", c10::toString(t.scalar_type())));
  }
}

// ---- lane helpers: float on 16 lanes, double one value at a time (its exp is libm's) ----

template <typename T>
T horizontal_sum(simd::Vec v) {
  T sum = 0;
  for (int64_t lane = 0; lane < simd::kLanes; ++lane) sum += v[lane];
  return sum;
}

// The largest of p[0, n), NaN if any is NaN (as amax).
template <typename T>
T row_maximum(const T* p, int64_t n) {
  T largest = -std::numeric_limits<T>::infinity();
  bool nan = false;
  int64_t j = 0;
  if constexpr (std::is_same_v<T, float>) {
    simd::Vec lanes = simd::Vec{} - std::numeric_limits<float>::infinity();
    simd::Bits nans = simd::Bits{};
    for (; j + simd::kLanes <= n; j += simd::kLanes) {
      const simd::Vec v = simd::load(p + j);
      lanes = v > lanes ? v : lanes;
      nans |= reinterpret_cast<simd::Bits>(v != v);
    }
    for (int64_t lane = 0; lane < simd::kLanes; ++lane) {
      largest = lanes[lane] > largest ? lanes[lane] : largest;
      nan = nan || nans[lane] != 0;
    }
  }
  for (; j < n; ++j) {
    largest = p[j] > largest ? p[j] : largest;
    nan = nan || p[j] != p[j];
  }
  return nan ? std::numeric_limits<T>::quiet_NaN() : largest;
}

// out[j] = exp(dash[j] - subtracted) + 1e-5 (the argument <= 0 but for rounding).
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void softmax_feature_row(const T* dash,
                                                                                             T subtracted, T* out,
                                                                                             int64_t n) {
  int64_t j = 0;
  if constexpr (std::is_same_v<T, float>) {
    const float stabilizer = static_cast<float>(kFeatureStabilizer);
    for (; j + simd::kLanes <= n; j += simd::kLanes) {
      simd::store(out + j, simd::exp_nonpositive(simd::load(dash + j) - subtracted) + stabilizer);
    }
    if (j < n) {
      const simd::Vec last = simd::exp_nonpositive(simd::load_partial(dash + j, n - j) - subtracted) + stabilizer;
      simd::store_partial(out + j, last, n - j);
    }
    return;
  }
  for (; j < n; ++j) out[j] = std::exp(dash[j] - subtracted) + static_cast<T>(kFeatureStabilizer);
}

// d[j] = g[j] exp(dash[j] - subtracted); returns sum_j d[j].
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) T softmax_feature_gradient_row(
    const T* g, const T* dash, T subtracted, T* d, int64_t n) {
  T sum = 0;
  int64_t j = 0;
  if constexpr (std::is_same_v<T, float>) {
    simd::Vec lanes = simd::Vec{};
    for (; j + simd::kLanes <= n; j += simd::kLanes) {
      const simd::Vec v = simd::load(g + j) * simd::exp_nonpositive(simd::load(dash + j) - subtracted);
      simd::store(d + j, v);
      lanes += v;
    }
    sum = horizontal_sum<float>(lanes);
    // The tail one value at a time: a partial load's zero lanes would give exp(-subtracted), which
    // overflows (0 * inf = NaN) where the row's maximum is far below 0.
    for (; j < n; ++j) {
      d[j] = g[j] * exp_nonpositive(dash[j] - subtracted);
      sum += d[j];
    }
    return sum;
  }
  for (; j < n; ++j) {
    d[j] = g[j] * std::exp(dash[j] - subtracted);
    sum += d[j];
  }
  return sum;
}

// ---- the feature maps ----

// x as rows [R, d] in groups of L rows (one group per leading index), and the projection
// scaled as the map takes it.
struct FeatureProblem {
  torch::Tensor rows, scaled_projection;
  int64_t groups = 0, length = 0, dim = 0, features = 0;
  double scale = 0;
};

FeatureProblem feature_problem(const torch::Tensor& x, const torch::Tensor& projection, FavorFeatureMap map) {
  check_dtype(x, "favor_features x");
  if (x.dim() < 2 || x.size(-1) < 1) {
    throw UsageError("favor_features x", "expected [..., L, d] with d at least 1, got " + c10::str(x.sizes()));
  }
  if (projection.dim() != 2 || projection.size(0) < 1 || projection.size(1) != x.size(-1) ||
      projection.scalar_type() != x.scalar_type()) {
    throw UsageError("favor_features projection",
                     fmt::format("expected {} [m, {}] with m at least 1, got {} {}", c10::toString(x.scalar_type()), x.size(-1),
                                 c10::toString(projection.scalar_type()), c10::str(projection.sizes())));
  }
  FeatureProblem p;
  p.length = x.size(-2);
  p.dim = x.size(-1);
  p.features = projection.size(0);
  p.groups = p.length == 0 ? 0 : x.numel() / (p.length * p.dim);
  p.rows = x.reshape({-1, p.dim}).contiguous();
  p.scale = projection_scale(map, p.dim, p.features);
  p.scaled_projection = projection * p.scale;
  return p;
}

// What a softmax map's backward needs: x^ P^T and, per row, what its exponent subtracted
// (|x^|^2 / 2 + s) and its maximum; s per row (its group's, for keys).
struct SoftmaxState {
  torch::Tensor dash, subtracted, row_max, stabilizer;
};

template <typename T>
SoftmaxState softmax_state(const FeatureProblem& p, FavorFeatureMap map) {
  SoftmaxState s;
  s.dash = kernels::mm(p.rows, p.scaled_projection.t());
  const int64_t rows = p.rows.size(0), d = p.dim, m = p.features;
  s.subtracted = at::empty({rows}, p.rows.options());
  s.row_max = at::empty({rows}, p.rows.options());
  const T* x = p.rows.data_ptr<T>();
  const T* dash = s.dash.data_ptr<T>();
  T* subtracted = s.subtracted.data_ptr<T>();
  T* row_max = s.row_max.data_ptr<T>();
  const T half_square_scale = static_cast<T>(p.scale * p.scale / 2);
  at::parallel_for(0, rows, kFavorRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T squares = 0;
      for (int64_t i = 0; i < d; ++i) squares += x[r * d + i] * x[r * d + i];
      subtracted[r] = squares * half_square_scale;  // + s below
      row_max[r] = row_maximum(dash + r * m, m);
    }
  });
  if (map == FavorFeatureMap::softmax_query) {
    s.stabilizer = s.row_max;
  } else {
    s.stabilizer = at::empty({rows}, p.rows.options());
    T* stabilizer = s.stabilizer.data_ptr<T>();
    at::parallel_for(0, p.groups, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const T largest = row_maximum(row_max + g * p.length, p.length);
        std::fill(stabilizer + g * p.length, stabilizer + (g + 1) * p.length, largest);
      }
    });
  }
  s.subtracted.add_(s.stabilizer);
  return s;
}

// exp(x^ P^T - |x^|^2 / 2 - s) + 1e-5 into `out` (which may be state.dash itself).
template <typename T>
void write_softmax_features(const SoftmaxState& state, const torch::Tensor& out) {
  const int64_t rows = state.dash.size(0), m = state.dash.size(1);
  const T* dash = state.dash.data_ptr<T>();
  const T* subtracted = state.subtracted.data_ptr<T>();
  T* to = out.data_ptr<T>();
  at::parallel_for(0, rows, kFavorRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_feature_row<T>(dash + r * m, subtracted[r], to + r * m, m);
  });
}

// relu(dash) + 1e-5 into `out` (which may be dash itself); NaN stays NaN, as in torch::relu.
template <typename T>
void write_relu_features(const torch::Tensor& dash, const torch::Tensor& out) {
  const T* from = dash.data_ptr<T>();
  T* to = out.data_ptr<T>();
  const T stabilizer = static_cast<T>(kFeatureStabilizer);
  at::parallel_for(0, dash.numel(), kFavorRowGrain * 128, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) to[i] = (from[i] > 0 || from[i] != from[i] ? from[i] : T(0)) + stabilizer;
  });
}

// The amax gradient of the stabilizers: each row's ds (its d/ds of the loss, -sum_j dF exp(...))
// added evenly to the positions holding its maximum; for keys, the group's ds first split evenly
// among the rows whose maximum is the group's.
template <typename T>
void add_maximum_gradients(const SoftmaxState& state, FavorFeatureMap map, const T* row_sums, int64_t length,
                           T* d_dash) {
  const int64_t rows = state.dash.size(0), m = state.dash.size(1);
  const T* dash = state.dash.data_ptr<T>();
  const T* row_max = state.row_max.data_ptr<T>();
  const T* stabilizer = state.stabilizer.data_ptr<T>();
  auto spread_over_row = [&](int64_t r, T ds) {
    int64_t holders = 0;
    for (int64_t j = 0; j < m; ++j) holders += dash[r * m + j] == row_max[r];
    for (int64_t j = 0; j < m; ++j) {
      if (dash[r * m + j] == row_max[r]) d_dash[r * m + j] += ds / static_cast<T>(holders);
    }
  };
  if (map == FavorFeatureMap::softmax_query) {
    at::parallel_for(0, rows, kFavorRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) spread_over_row(r, -row_sums[r]);
    });
    return;
  }
  at::parallel_for(0, length == 0 ? 0 : rows / length, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * length;
      T ds = 0;
      int64_t holders = 0;
      for (int64_t r = first; r < first + length; ++r) {
        ds -= row_sums[r];
        holders += row_max[r] == stabilizer[r];
      }
      for (int64_t r = first; r < first + length; ++r) {
        if (row_max[r] == stabilizer[r]) spread_over_row(r, ds / static_cast<T>(holders));
      }
    }
  });
}

// d/d(x^ P^T) of the loss, and the rows' coefficients of x in dx (d/d|x^|^2 terms).
template <typename T>
std::pair<torch::Tensor, torch::Tensor> softmax_dash_gradient(const SoftmaxState& state, FavorFeatureMap map,
                                                              const torch::Tensor& grad, int64_t length,
                                                              double scale) {
  const int64_t rows = state.dash.size(0), m = state.dash.size(1);
  torch::Tensor d_dash = at::empty_like(state.dash);
  torch::Tensor row_sums = at::empty({rows}, state.dash.options());
  const T* g = grad.data_ptr<T>();
  const T* dash = state.dash.data_ptr<T>();
  const T* subtracted = state.subtracted.data_ptr<T>();
  T* d = d_dash.data_ptr<T>();
  T* sums = row_sums.data_ptr<T>();
  at::parallel_for(0, rows, kFavorRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      sums[r] = softmax_feature_gradient_row<T>(g + r * m, dash + r * m, subtracted[r], d + r * m, m);
    }
  });
  add_maximum_gradients<T>(state, map, sums, length, d);
  return {d_dash, row_sums * -(scale * scale)};  // d|x^|^2/2 / dx = scale^2 x
}

template <typename T>
torch::Tensor relu_dash_gradient(const torch::Tensor& dash, const torch::Tensor& grad) {
  torch::Tensor d_dash = at::empty_like(dash);
  const T* g = grad.data_ptr<T>();
  const T* from = dash.data_ptr<T>();
  T* d = d_dash.data_ptr<T>();
  at::parallel_for(0, dash.numel(), kFavorRowGrain * 128, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) d[i] = from[i] <= 0 ? T(0) : g[i];  // threshold_backward's
  });
  return d_dash;
}

// Features of a problem, into a fresh tensor when `keep_dash` (its backward reads x^ P^T),
// otherwise over x^ P^T itself.
struct FeatureForward {
  torch::Tensor features;
  SoftmaxState state;  // softmax maps; for ReLU only state.dash
};

FeatureForward feature_forward(const FeatureProblem& p, FavorFeatureMap map, bool keep_dash) {
  FeatureForward f;
  AT_DISPATCH_FLOATING_TYPES(p.rows.scalar_type(), "favor_features", [&] {
    if (is_softmax(map)) {
      f.state = softmax_state<scalar_t>(p, map);
    } else {
      f.state.dash = kernels::mm(p.rows, p.scaled_projection.t());
    }
    f.features = keep_dash ? at::empty_like(f.state.dash) : f.state.dash;
    if (is_softmax(map)) {
      write_softmax_features<scalar_t>(f.state, f.features);
    } else {
      write_relu_features<scalar_t>(f.state.dash, f.features);
    }
  });
  return f;
}

torch::Tensor shaped_features(const torch::Tensor& features, const torch::Tensor& x) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = features.size(1);
  return features.view(sizes);
}

struct FavorFeaturesFunction : torch::autograd::Function<FavorFeaturesFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& projection, int64_t map_index) {
    const auto map = static_cast<FavorFeatureMap>(map_index);
    const FeatureProblem p = feature_problem(x, projection, map);
    FeatureForward f = feature_forward(p, map, /*keep_dash=*/true);
    ctx->save_for_backward({x, projection, f.state.dash, f.state.subtracted, f.state.row_max, f.state.stabilizer});
    ctx->saved_data["map"] = map_index;
    return shaped_features(f.features, x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &projection = saved[1];
    const auto map = static_cast<FavorFeatureMap>(ctx->saved_data["map"].toInt());
    if (at::GradMode::is_enabled()) {  // create_graph: LibTorch's ops, differentiable in turn
      auto grads = gradients_of(unfused_features(x, projection, map), {x, projection}, grad_outputs[0]);
      grads.emplace_back();
      return grads;
    }
    const SoftmaxState state{saved[2], saved[3], saved[4], saved[5]};
    const FeatureProblem p = feature_problem(x, projection, map);
    const torch::Tensor grad = grad_outputs[0].reshape({-1, p.features}).contiguous();
    torch::Tensor d_dash, row_coefficients;
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "favor_features_backward", [&] {
      if (is_softmax(map)) {
        std::tie(d_dash, row_coefficients) = softmax_dash_gradient<scalar_t>(state, map, grad, p.length, p.scale);
      } else {
        d_dash = relu_dash_gradient<scalar_t>(state.dash, grad);
      }
    });
    torch::Tensor dx, dprojection;
    if (ctx->needs_input_grad(0)) {
      // d(x^ P^T)/dx = scale P, and for softmax the row's coefficient times x.
      dx = kernels::mm(d_dash, p.scaled_projection);
      if (row_coefficients.defined()) dx.addcmul_(p.rows, row_coefficients.unsqueeze(1));
      dx = dx.view(x.sizes());
    }
    if (ctx->needs_input_grad(1)) dprojection = kernels::mm(d_dash.t(), p.rows).mul_(p.scale);
    return {dx, dprojection, torch::Tensor()};
  }
};

// ---- the contraction ----

// [..., L, n] as [N, L, n] (a view where it can be).
torch::Tensor batched(const torch::Tensor& t) { return t.reshape({-1, t.size(-2), t.size(-1)}); }

void check_contraction(const torch::Tensor& qf, const torch::Tensor& kf, const torch::Tensor& values) {
  check_dtype(qf, "favor_contraction query_features");
  auto fail = [&](const char* field, const std::string& expected, const torch::Tensor& got) {
    throw UsageError(std::string("favor_contraction ") + field,
                     fmt::format("expected {}, got {} {}", expected, c10::toString(got.scalar_type()), c10::str(got.sizes())));
  };
  if (qf.dim() < 2) fail("query_features", "[..., L, m]", qf);
  const auto leading = qf.sizes().slice(0, qf.dim() - 2);
  const std::string dtype = c10::toString(qf.scalar_type());
  std::string leading_text;  // "2, 4, " for leading dimensions [2, 4]
  for (const int64_t size : leading) leading_text += fmt::format("{}, ", size);
  if (kf.dim() != qf.dim() || kf.sizes().slice(0, kf.dim() - 2) != leading || kf.size(-1) != qf.size(-1) ||
      kf.scalar_type() != qf.scalar_type()) {
    fail("key_features", fmt::format("{} [{}S, {}]", dtype, leading_text, qf.size(-1)), kf);
  }
  if (values.dim() != qf.dim() || values.sizes().slice(0, values.dim() - 2) != leading ||
      values.size(-2) != kf.size(-2) || values.scalar_type() != qf.scalar_type()) {
    fail("values", fmt::format("{} [{}{}, dv]", dtype, leading_text, kf.size(-2)), values);
  }
}

// [V | 1]: the values with a column of ones, whose products give the normaliser beside the
// numerator.
torch::Tensor with_ones(const torch::Tensor& values) {
  const int64_t dv = values.size(-1);
  torch::Tensor joined = at::empty({values.size(0), values.size(1), dv + 1}, values.options());
  joined.narrow(-1, 0, dv).copy_(values);
  joined.narrow(-1, dv, 1).fill_(1);
  return joined;
}

// out = [N | D] columns :dv over column dv, 0 where D is.
template <typename T>
torch::Tensor divided(const torch::Tensor& products) {
  const int64_t rows = products.numel() / products.size(-1), dv = products.size(-1) - 1;
  torch::Tensor out = at::empty({products.size(0), products.size(1), dv}, products.options());
  const T* from = products.data_ptr<T>();
  T* to = out.data_ptr<T>();
  at::parallel_for(0, rows, kFavorRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T normaliser = from[r * (dv + 1) + dv];
      const T divisor = normaliser == 0 ? T(1) : normaliser;
      for (int64_t c = 0; c < dv; ++c) to[r * dv + c] = from[r * (dv + 1) + c] / divisor;
    }
  });
  return out;
}

// [dN | dD] for out = N / D: g / D, and -sum_c g_c N_c / D^2 (0 where D is 0, which was replaced by 1).
template <typename T>
torch::Tensor products_gradient(const torch::Tensor& grad, const torch::Tensor& products) {
  const int64_t rows = products.numel() / products.size(-1), dv = products.size(-1) - 1;
  torch::Tensor d = at::empty_like(products);
  const T* g = grad.data_ptr<T>();
  const T* from = products.data_ptr<T>();
  T* to = d.data_ptr<T>();
  at::parallel_for(0, rows, kFavorRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T normaliser = from[r * (dv + 1) + dv];
      const T divisor = normaliser == 0 ? T(1) : normaliser;
      T weighted = 0;
      for (int64_t c = 0; c < dv; ++c) {
        to[r * (dv + 1) + c] = g[r * dv + c] / divisor;
        weighted += g[r * dv + c] * from[r * (dv + 1) + c];
      }
      to[r * (dv + 1) + dv] = normaliser == 0 ? T(0) : -weighted / (normaliser * normaliser);
    }
  });
  return d;
}

// Positions per block of the causal contraction: within a block the masked [C, C] products,
// across blocks one [m, dv + 1] state each, linear in L for a fixed C.
constexpr int64_t kCausalBlock = 128;

// Zeroes the entries above the diagonal of a square [c, c] block whose rows are contiguous.
void zero_above_diagonal(torch::Tensor& block) {
  AT_DISPATCH_FLOATING_TYPES(block.scalar_type(), "zero_above_diagonal", [&] {
    scalar_t* rows = block.data_ptr<scalar_t>();
    const int64_t size = block.size(0), stride = block.stride(0);
    for (int64_t i = 0; i + 1 < size; ++i) std::fill(rows + i * stride + i + 1, rows + i * stride + size, scalar_t(0));
  });
}

// Causal [N | D] for each of the N matrices: block b's rows are phi(Q_b) S_b + tril(phi(Q_b)
// phi(K_b)^T) [V_b | 1], S_b = sum over earlier blocks of phi(K)^T [V | 1] (kept in `states`,
// [N, blocks, m, dv + 1], for the backward).
void causal_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& joined, torch::Tensor& products,
                    torch::Tensor& states) {
  const int64_t length = q.size(1), blocks = states.size(1);
  at::parallel_for(0, q.size(0), 1, [&](int64_t begin, int64_t end) {
    torch::Tensor scores = at::empty({kCausalBlock, kCausalBlock}, q.options());
    for (int64_t n = begin; n < end; ++n) {
      torch::Tensor state = at::zeros({q.size(2), joined.size(2)}, q.options());
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t first = b * kCausalBlock, rows = std::min(kCausalBlock, length - first);
        const torch::Tensor qb = q[n].narrow(0, first, rows), kb = k[n].narrow(0, first, rows);
        const torch::Tensor vb = joined[n].narrow(0, first, rows);
        torch::Tensor out = products[n].narrow(0, first, rows), w = scores.narrow(0, 0, rows).narrow(1, 0, rows);
        states[n][b].copy_(state);
        kernels::mm_into(out, qb, state);
        kernels::mm_into(w, qb, kb.t());
        zero_above_diagonal(w);
        kernels::mm_into(out, w, vb, 1.0f);
        kernels::mm_into(state, kb.t(), vb, 1.0f);
      }
    }
  });
}

struct CausalGradients {
  torch::Tensor dq, dk, djoined;
};

// The causal forward's gradients from d[N | D] (`d_products`), blocks last to first, R the sum of
// phi(Q_j)^T d[N | D]_j over the later blocks j (what S_b's gradient is):
//   dQ_b = dP_b S_b^T + dW_b K_b,  dK_b = dW_b^T Q_b + [V | 1]_b R^T,  d[V | 1]_b = W_b^T dP_b + K_b R,
// dW_b = tril(dP_b [V | 1]_b^T), W_b = tril(Q_b K_b^T).
CausalGradients causal_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& joined,
                                const torch::Tensor& states, const torch::Tensor& d_products) {
  CausalGradients g{at::empty_like(q), at::empty_like(k), at::empty_like(joined)};
  const int64_t length = q.size(1), blocks = states.size(1);
  at::parallel_for(0, q.size(0), 1, [&](int64_t begin, int64_t end) {
    torch::Tensor w = at::empty({kCausalBlock, kCausalBlock}, q.options()), dw = at::empty_like(w);
    for (int64_t n = begin; n < end; ++n) {
      torch::Tensor later = at::zeros({q.size(2), joined.size(2)}, q.options());  // R
      for (int64_t b = blocks - 1; b >= 0; --b) {
        const int64_t first = b * kCausalBlock, rows = std::min(kCausalBlock, length - first);
        const torch::Tensor qb = q[n].narrow(0, first, rows), kb = k[n].narrow(0, first, rows);
        const torch::Tensor vb = joined[n].narrow(0, first, rows), gb = d_products[n].narrow(0, first, rows);
        torch::Tensor dqb = g.dq[n].narrow(0, first, rows), dkb = g.dk[n].narrow(0, first, rows);
        torch::Tensor dvb = g.djoined[n].narrow(0, first, rows);
        torch::Tensor wb = w.narrow(0, 0, rows).narrow(1, 0, rows), dwb = dw.narrow(0, 0, rows).narrow(1, 0, rows);
        kernels::mm_into(wb, qb, kb.t());
        zero_above_diagonal(wb);
        kernels::mm_into(dwb, gb, vb.t());
        zero_above_diagonal(dwb);
        kernels::mm_into(dqb, gb, states[n][b].t());
        kernels::mm_into(dqb, dwb, kb, 1.0f);
        kernels::mm_into(dkb, dwb.t(), qb);
        kernels::mm_into(dkb, vb, later.t(), 1.0f);
        kernels::mm_into(dvb, wb.t(), gb);
        kernels::mm_into(dvb, kb, later, 1.0f);
        kernels::mm_into(later, qb.t(), gb, 1.0f);
      }
    }
  });
  return g;
}

torch::Tensor unfused_causal_contraction(const torch::Tensor& qf, const torch::Tensor& kf, const torch::Tensor& values) {
  const torch::Tensor scores = torch::matmul(qf, kf.transpose(-2, -1)).tril();
  const torch::Tensor normaliser = scores.sum(-1, /*keepdim=*/true);
  return torch::matmul(scores, values) / normaliser.masked_fill(normaliser == 0, 1);
}

struct FavorContractionFunction : torch::autograd::Function<FavorContractionFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qf, const torch::Tensor& kf,
                               const torch::Tensor& values, bool causal) {
    const torch::Tensor q = batched(qf).contiguous(), k = batched(kf).contiguous(), joined = with_ones(batched(values));
    torch::Tensor states, products;
    if (causal) {
      const int64_t blocks = (q.size(1) + kCausalBlock - 1) / kCausalBlock;
      states = at::empty({q.size(0), blocks, q.size(2), joined.size(2)}, q.options());
      products = at::empty({q.size(0), q.size(1), joined.size(2)}, q.options());
      causal_forward(q, k, joined, products, states);
    } else {
      states = kernels::bmm(k.transpose(1, 2), joined);  // [phi(K)^T V | sum_j phi(k_j)]
      products = kernels::bmm(q, states);                // [N | D]
    }
    torch::Tensor out;
    AT_DISPATCH_FLOATING_TYPES(qf.scalar_type(), "favor_contraction", [&] { out = divided<scalar_t>(products); });
    ctx->save_for_backward({qf, kf, values, joined, states, products});
    ctx->saved_data["causal"] = causal;
    std::vector<int64_t> sizes = qf.sizes().vec();
    sizes.back() = values.size(-1);
    return out.view(sizes);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &qf = saved[0], &kf = saved[1], &values = saved[2];
    const bool causal = ctx->saved_data["causal"].toBool();
    if (at::GradMode::is_enabled()) {  // create_graph: LibTorch's ops, differentiable in turn
      auto grads = gradients_of(causal ? unfused_causal_contraction(qf, kf, values) : unfused_contraction(qf, kf, values),
                                {qf, kf, values}, grad_outputs[0]);
      grads.emplace_back();
      return grads;
    }
    const torch::Tensor &joined = saved[3], &states = saved[4], &products = saved[5];
    const torch::Tensor grad = batched(grad_outputs[0]).contiguous();
    torch::Tensor d_products;
    AT_DISPATCH_FLOATING_TYPES(qf.scalar_type(), "favor_contraction_backward",
                               [&] { d_products = products_gradient<scalar_t>(grad, products); });
    const torch::Tensor q = batched(qf).contiguous(), k = batched(kf).contiguous();
    const int64_t value_dim = values.size(-1);
    torch::Tensor dq, dk, dv;
    if (causal) {
      const CausalGradients g = causal_backward(q, k, joined, states, d_products);
      dq = g.dq.view(qf.sizes());
      dk = g.dk.view(kf.sizes());
      dv = g.djoined.narrow(-1, 0, value_dim).reshape(values.sizes());
      return {dq, dk, dv, torch::Tensor()};
    }
    if (ctx->needs_input_grad(0)) dq = kernels::bmm(d_products, states.transpose(1, 2)).view(qf.sizes());
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const torch::Tensor d_states = kernels::bmm(q.transpose(1, 2), d_products);
      if (ctx->needs_input_grad(1)) dk = kernels::bmm(joined, d_states.transpose(1, 2)).view(kf.sizes());
      if (ctx->needs_input_grad(2)) dv = kernels::bmm(k, d_states.narrow(-1, 0, value_dim)).view(values.sizes());
    }
    return {dq, dk, dv, torch::Tensor()};
  }
};

bool records_gradient(std::initializer_list<torch::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.requires_grad()) return true;
  }
  return false;
}

}  // namespace

torch::Tensor favor_features(const torch::Tensor& x, const torch::Tensor& projection, FavorFeatureMap map) {
  if (records_gradient({x, projection})) {
    return FavorFeaturesFunction::apply(x, projection, static_cast<int64_t>(map));
  }
  const FeatureProblem p = feature_problem(x, projection, map);
  return shaped_features(feature_forward(p, map, /*keep_dash=*/false).features, x);
}

torch::Tensor favor_contraction(const torch::Tensor& query_features, const torch::Tensor& key_features,
                                const torch::Tensor& values, bool causal) {
  check_contraction(query_features, key_features, values);
  if (causal && key_features.size(-2) != query_features.size(-2)) {
    throw UsageError("favor_contraction key_features",
                     fmt::format("causal: as many keys as queries ({}), got {}", query_features.size(-2),
                                 key_features.size(-2)));
  }
  return FavorContractionFunction::apply(query_features, key_features, values, causal);
}

}  // namespace afterburner::kernels
