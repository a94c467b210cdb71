#include "afterburner/sketch/operators.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/random.h"
#include "signs.h"

namespace afterburner::sketch {
namespace {

constexpr std::array<std::pair<SketchKind, const char*>, 5> kKindNames{{{SketchKind::gaussian, "gaussian"},
                                                                        {SketchKind::sign, "sign"},
                                                                        {SketchKind::sjlt, "sjlt"},
                                                                        {SketchKind::count, "count"},
                                                                        {SketchKind::srht, "srht"}}};
// Row elements below which a parallel chunk is not worth a thread (ATen's GRAIN_SIZE).
constexpr int64_t kGrainElements = 32768;

bool is_dense_kind(SketchKind kind) { return kind == SketchKind::gaussian || kind == SketchKind::sign; }

int64_t nonzeros_per_column(const SketchOptions& o) {
  return o.kind() == SketchKind::count ? 1 : o.nonzeros_per_column();
}

int64_t next_power_of_two(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

int64_t grain_rows(int64_t row_work) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, row_work)); }

void check_options(const SketchOptions& o) {
  if (o.input_dim() < 1) {
    throw UsageError("SketchOptions input_dim", fmt::format("must be at least 1, got {}", o.input_dim()));
  }
  if (o.sketch_dim() < 1 || o.sketch_dim() > o.input_dim()) {
    throw UsageError("SketchOptions sketch_dim",
                     fmt::format("must be between 1 and input_dim ({}), got {}", o.input_dim(), o.sketch_dim()));
  }
  if (o.kind() == SketchKind::sjlt && (o.nonzeros_per_column() < 1 || o.nonzeros_per_column() > o.sketch_dim())) {
    throw UsageError("SketchOptions nonzeros_per_column", fmt::format("must be between 1 and sketch_dim ({}), got {}",
                                                                      o.sketch_dim(), o.nonzeros_per_column()));
  }
}

// +-1 with equal probability, as int8.
torch::Tensor random_signs(torch::IntArrayRef shape, at::Generator& generator) {
  return (torch::randint(0, 2, shape, generator, torch::kChar) * 2 - 1).to(torch::kChar);
}

// For each of n columns, `count` distinct rows of `rows` drawn uniformly (Floyd's algorithm: for
// i = 0 .. count-1 take t uniform in [0, rows - count + i], or rows - count + i if t is taken).
torch::Tensor distinct_rows_per_column(int64_t columns, int64_t count, int64_t rows, at::Generator& generator) {
  const torch::Tensor uniform = torch::rand({columns, count}, generator, torch::kDouble);
  const auto u = uniform.accessor<double, 2>();
  torch::Tensor chosen = torch::empty({columns, count}, torch::kInt);
  auto out = chosen.accessor<int32_t, 2>();
  for (int64_t j = 0; j < columns; ++j) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t top = rows - count + i;
      const auto t = std::min<int64_t>(top, static_cast<int64_t>(u[j][i] * static_cast<double>(top + 1)));
      bool taken = false;
      for (int64_t k = 0; k < i; ++k) taken = taken || out[j][k] == t;
      out[j][i] = static_cast<int32_t>(taken ? top : t);
    }
  }
  return chosen;
}

// x <- H x for n = 2^k: log2(n) rounds of butterflies (a, b) -> (a + b, a - b) at strides 1, 2, 4, ...,
// which is the Sylvester recursion H_2h [u; v] = [H_h u + H_h v; H_h u - H_h v] unrolled.
template <typename T>
inline void walsh_hadamard_row(T* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
#pragma omp simd
      for (int64_t j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// The row kernels below are cloned per instruction set and picked at run time; flatten inlines
// walsh_hadamard_row so that each clone vectorises its butterflies for its own vector width.
#define AFTERBURNER_SKETCH_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))

template <typename T>
AFTERBURNER_SKETCH_CLONES void walsh_hadamard_rows(T* data, int64_t n, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) walsh_hadamard_row(data + r * n, n);
}

// Each operator's shape and random draws: what the structured kernels and autograd need.
struct Structure {
  SketchKind kind;
  int64_t input_dim, sketch_dim;
  torch::Tensor rows, signs;  // as in SketchOperator
};

// A structure as the row kernels read it: sizes, raw row indices and signs, and the scale
// 1/sqrt(count) of its entries (count: nonzeros per column for sjlt/count, m for srht).
template <typename T>
struct RawStructure {
  RawStructure(const Structure& s, int64_t count)
      : n(s.input_dim), m(s.sketch_dim), rows(s.rows.data_ptr<int32_t>()), signs(s.signs.data_ptr<int8_t>()),
        scale(static_cast<T>(1.0 / std::sqrt(static_cast<double>(count)))) {}
  int64_t n, m;
  const int32_t* rows;
  const int8_t* signs;
  T scale;
};

// sjlt/count, S x: y_r = sum over the nonzeros (r, j) of S of sigma_rj / sqrt(s) x_j, a scatter of
// each x_j to its s rows.
template <typename T>
void scatter_columns(const Structure& s, const T* x, T* y, int64_t begin, int64_t end) {
  const int64_t nonzeros = s.rows.size(1);
  const RawStructure<T> c(s, nonzeros);
  for (int64_t b = begin; b < end; ++b) {
    const T* xb = x + b * c.n;
    T* yb = y + b * c.m;
    for (int64_t j = 0; j < c.n; ++j) {
      const T v = c.scale * xb[j];
      for (int64_t k = 0; k < nonzeros; ++k) yb[c.rows[j * nonzeros + k]] += c.signs[j * nonzeros + k] * v;
    }
  }
}

// sjlt/count, S^T y: x_j = sum over column j's nonzeros (r, j) of sigma_rj / sqrt(s) y_r, a gather.
template <typename T>
void gather_columns(const Structure& s, const T* y, T* x, int64_t begin, int64_t end) {
  const int64_t nonzeros = s.rows.size(1);
  const RawStructure<T> c(s, nonzeros);
  for (int64_t b = begin; b < end; ++b) {
    const T* yb = y + b * c.m;
    T* xb = x + b * c.n;
    for (int64_t j = 0; j < c.n; ++j) {
      T sum = 0;
      for (int64_t k = 0; k < nonzeros; ++k) sum += c.signs[j * nonzeros + k] * yb[c.rows[j * nonzeros + k]];
      xb[j] = c.scale * sum;
    }
  }
}

// srht, S x = (1/sqrt(m)) P H D x: x times the signs, zero-padded to n', transformed, then the kept rows.
template <typename T>
AFTERBURNER_SKETCH_CLONES void srht_rows(const Structure& s, const T* x, T* y, int64_t begin, int64_t end) {
  const RawStructure<T> c(s, s.sketch_dim);
  std::vector<T> buffer(next_power_of_two(c.n));
  for (int64_t b = begin; b < end; ++b) {
    const T* xb = x + b * c.n;
    for (int64_t j = 0; j < c.n; ++j) buffer[j] = c.signs[j] * xb[j];
    std::fill(buffer.begin() + c.n, buffer.end(), T(0));
    walsh_hadamard_row(buffer.data(), static_cast<int64_t>(buffer.size()));
    for (int64_t r = 0; r < c.m; ++r) y[b * c.m + r] = c.scale * buffer[c.rows[r]];
  }
}

// srht, S^T y = (1/sqrt(m)) D H P^T y (H is symmetric): y placed at the kept rows of n' zeros,
// transformed, times the signs, truncated to n.
template <typename T>
AFTERBURNER_SKETCH_CLONES void srht_transpose_rows(const Structure& s, const T* y, T* x, int64_t begin, int64_t end) {
  const RawStructure<T> c(s, s.sketch_dim);
  std::vector<T> buffer(next_power_of_two(c.n));
  for (int64_t b = begin; b < end; ++b) {
    std::fill(buffer.begin(), buffer.end(), T(0));
    for (int64_t r = 0; r < c.m; ++r) buffer[c.rows[r]] = y[b * c.m + r];
    walsh_hadamard_row(buffer.data(), static_cast<int64_t>(buffer.size()));
    for (int64_t j = 0; j < c.n; ++j) x[b * c.n + j] = c.scale * c.signs[j] * buffer[j];
  }
}

// S (or S^T when `transpose`) applied to each row of the contiguous [rows, n] (or [rows, m]) input.
torch::Tensor run_structured(const Structure& s, const torch::Tensor& input, bool transpose) {
  const int64_t batch = input.size(0);
  const int64_t out_dim = transpose ? s.input_dim : s.sketch_dim;
  const bool srht = s.kind == SketchKind::srht;
  torch::Tensor output = srht || transpose ? torch::empty({batch, out_dim}, input.options())
                                           : torch::zeros({batch, out_dim}, input.options());
  const int64_t row_work = srht ? next_power_of_two(s.input_dim) : s.input_dim * s.rows.size(1);
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "sketch_operator", [&] {
    const scalar_t* in = input.data_ptr<scalar_t>();
    scalar_t* out = output.data_ptr<scalar_t>();
    at::parallel_for(0, batch, grain_rows(row_work), [&](int64_t begin, int64_t end) {
      if (srht) {
        transpose ? srht_transpose_rows(s, in, out, begin, end) : srht_rows(s, in, out, begin, end);
      } else {
        transpose ? gather_columns(s, in, out, begin, end) : scatter_columns(s, in, out, begin, end);
      }
    });
  });
  return output;
}

// The structured kernels under autograd: the backward of S (S^T) is S^T (S), itself differentiable.
class StructuredSketch : public torch::autograd::Function<StructuredSketch> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const Structure& s, bool transpose) {
    ctx->saved_data["kind"] = static_cast<int64_t>(s.kind);
    ctx->saved_data["input_dim"] = s.input_dim;
    ctx->saved_data["sketch_dim"] = s.sketch_dim;
    ctx->saved_data["rows"] = s.rows;
    ctx->saved_data["signs"] = s.signs;
    ctx->saved_data["transpose"] = transpose;
    return run_structured(s, input.contiguous(), transpose);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Structure s{static_cast<SketchKind>(ctx->saved_data["kind"].toInt()), ctx->saved_data["input_dim"].toInt(),
                      ctx->saved_data["sketch_dim"].toInt(), ctx->saved_data["rows"].toTensor(),
                      ctx->saved_data["signs"].toTensor()};
    const bool transpose = ctx->saved_data["transpose"].toBool();
    return {apply(grads[0], s, !transpose), torch::Tensor(), torch::Tensor()};
  }
};

void check_input(const torch::Tensor& input, int64_t in_dim) {
  const auto dtype = input.scalar_type();
  if (input.dim() == 0 || input.size(-1) != in_dim || (dtype != torch::kFloat && dtype != torch::kDouble)) {
    throw UsageError("SketchOperator input", fmt::format("expected [..., {}] float32 or float64, got {} {}", in_dim,
                                                         c10::str(input.sizes()), c10::toString(dtype)));
  }
}

// The structured kernels on the rows of `input` [..., in_dim], giving [..., out_dim].
torch::Tensor map_rows(const Structure& s, const torch::Tensor& input, bool transpose) {
  const int64_t in_dim = transpose ? s.sketch_dim : s.input_dim;
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() = transpose ? s.input_dim : s.sketch_dim;
  return StructuredSketch::apply(input.reshape({-1, in_dim}), s, transpose).view(sizes);
}

}  // namespace

SketchKind parse_sketch_kind(const std::string& name) {
  for (const auto& [kind, kind_name] : kKindNames) {
    if (name == kind_name) return kind;
  }
  throw UsageError("sketch kind", fmt::format("unknown '{}'; expected gaussian, sign, sjlt, count or srht", name));
}

std::string to_string(SketchKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

SketchOperator::SketchOperator(const SketchOptions& options) : options_(options) {
  check_options(options_);
  if (!options_.seed()) options_.seed(draw_seed());
  at::Generator generator = seeded_generator(*options_.seed());
  const int64_t n = options_.input_dim(), m = options_.sketch_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(m));
  switch (options_.kind()) {
    case SketchKind::gaussian:
      matrix_ = torch::randn({m, n}, generator, torch::kDouble) * scale;
      break;
    case SketchKind::sign:
      matrix_ = random_signs({m, n}, generator).to(torch::kDouble) * scale;
      break;
    case SketchKind::sjlt:
    case SketchKind::count:
      rows_ = distinct_rows_per_column(n, nonzeros_per_column(options_), m, generator);
      signs_ = random_signs({n, nonzeros_per_column(options_)}, generator);
      break;
    case SketchKind::srht:
      signs_ = random_signs({n}, generator);
      rows_ = torch::randperm(next_power_of_two(n), generator, torch::kInt).slice(0, 0, m).contiguous();
      break;
  }
  if (matrix_.defined()) matrix_float_ = matrix_.to(torch::kFloat);
}

torch::Tensor SketchOperator::apply(const torch::Tensor& x) const { return map(x, false); }

torch::Tensor SketchOperator::transpose_apply(const torch::Tensor& y) const { return map(y, true); }

torch::Tensor SketchOperator::map(const torch::Tensor& input, bool transpose) const {
  check_input(input, transpose ? options_.sketch_dim() : options_.input_dim());
  if (is_dense_kind(options_.kind())) {
    const torch::Tensor& matrix = input.scalar_type() == torch::kFloat ? matrix_float_ : matrix_;
    return input.matmul(transpose ? matrix : matrix.t());
  }
  return map_rows(Structure{options_.kind(), options_.input_dim(), options_.sketch_dim(), rows_, signs_}, input,
                  transpose);
}

torch::Tensor SketchOperator::dense() const {
  if (is_dense_kind(options_.kind())) return matrix_.clone();
  const int64_t n = options_.input_dim(), m = options_.sketch_dim();
  torch::Tensor s = torch::zeros({m, n}, torch::kDouble);
  auto entry = s.accessor<double, 2>();
  if (options_.kind() == SketchKind::srht) {
    // S_rj = (1/sqrt(m)) H_{p_r, j} d_j with the Sylvester entry H_ij = (-1)^popcount(i & j).
    const auto kept = rows_.accessor<int32_t, 1>();
    const auto d = signs_.accessor<int8_t, 1>();
    const double scale = 1.0 / std::sqrt(static_cast<double>(m));
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        const bool odd = __builtin_popcountll(static_cast<uint64_t>(kept[r]) & static_cast<uint64_t>(j)) % 2 == 1;
        entry[r][j] = (odd ? -scale : scale) * d[j];
      }
    }
    return s;
  }
  const auto rows = rows_.accessor<int32_t, 2>();
  const auto signs = signs_.accessor<int8_t, 2>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(rows_.size(1)));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t k = 0; k < rows_.size(1); ++k) entry[rows[j][k]][j] = signs[j][k] * scale;
  }
  return s;
}

void walsh_hadamard_(torch::Tensor& rows) {
  const int64_t n = rows.dim() == 0 ? 0 : rows.size(-1);
  const auto dtype = rows.scalar_type();
  if (n < 1 || (n & (n - 1)) != 0 || !rows.is_contiguous() || (dtype != torch::kFloat && dtype != torch::kDouble)) {
    throw UsageError("walsh_hadamard_ rows",
                     fmt::format("expected a contiguous [..., 2^k] float32 or float64 tensor, got {} {}{}",
                                 c10::str(rows.sizes()), c10::toString(dtype),
                                 rows.is_contiguous() ? "" : " (not contiguous)"));
  }
  // Written through data_ptr, so autograd sees none of it: refuse what it would have to record,
  // and bump the version counter as LibTorch's in-place ops do, so that a backward reading
  // `rows` as a saved tensor fails instead of using the transformed values.
  if (torch::GradMode::is_enabled() && rows.requires_grad()) {
    throw UsageError("walsh_hadamard_ rows", "requires grad, and the transform is not differentiable (run it on a "
                                             "detached tensor or under torch::NoGradGuard)");
  }
  rows.unsafeGetTensorImpl()->bump_version();
  const int64_t count = rows.numel() / n;
  AT_DISPATCH_FLOATING_TYPES(dtype, "walsh_hadamard_", [&] {
    scalar_t* data = rows.data_ptr<scalar_t>();
    at::parallel_for(0, count, grain_rows(n), [&](int64_t begin, int64_t end) {
      walsh_hadamard_rows(data, n, begin, end);
    });
  });
}

}  // namespace afterburner::sketch
