// The pieces kernels::attention's two kernels share (attention.cpp's tiled one, short_attention.cpp's
// for short key sequences): operands as strided matrices, the masking of a row of scores, exp,
// and the task loop. Internal to src/kernels.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/accumulate.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "exp_nonpositive.h"

namespace afterburner::kernels::attention_detail {

template <typename acc_t>
constexpr acc_t kMinusInfinity = -std::numeric_limits<acc_t>::infinity();

inline float exp_of(float v) { return exp_nonpositive(v); }
inline double exp_of(double v) { return std::exp(v); }

// ---- Operands as matrices ----

// A tensor [batch..., rows, cols] as `batch` matrices: matrix b starts at data + offsets[b], its
// rows row_stride apart and its columns col_stride apart (1 for GEMM operands; a mask may
// broadcast with stride 0).
template <typename T>
struct Matrices {
  T* data = nullptr;
  std::vector<int64_t> offsets;
  int64_t row_stride = 0, col_stride = 1;

  T* row(int64_t b, int64_t r) const { return data + offsets[b] + r * row_stride; }
};

inline std::vector<int64_t> batch_offsets(const torch::Tensor& t) {
  const int64_t batch_dims = t.dim() - 2;
  std::vector<int64_t> offsets(c10::multiply_integers(t.sizes().slice(0, batch_dims)));
  for (int64_t b = 0; b < static_cast<int64_t>(offsets.size()); ++b) {
    int64_t rest = b, offset = 0;
    for (int64_t d = batch_dims - 1; d >= 0; --d) {
      offset += (rest % t.size(d)) * t.stride(d);
      rest /= t.size(d);
    }
    offsets[b] = offset;
  }
  return offsets;
}

template <typename T>
Matrices<T> matrices_of(const torch::Tensor& t) {
  Matrices<T> m;
  m.data = t.data_ptr<std::remove_const_t<T>>();
  m.offsets = batch_offsets(t);
  m.row_stride = t.size(-2) > 1 ? t.stride(-2) : std::max<int64_t>(1, t.size(-1));
  m.col_stride = t.stride(-1);
  return m;
}

struct Sizes {
  int64_t batch, q_len, k_len, head_dim, value_dim;
};

inline Sizes sizes_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return {q.numel() / std::max<int64_t>(1, q.size(-2) * q.size(-1)), q.size(-2), k.size(-2), q.size(-1), v.size(-1)};
}

// What a kernel reads: q, k, v as matrices of T, an additive mask in the accumulation type acc_t
// (data null without one), the scale and whether the causal mask applies.
template <typename T, typename acc_t>
struct Operands {
  Sizes sizes;
  Matrices<const T> q, k, v;
  Matrices<const acc_t> mask;
  acc_t scale;
  bool causal;
};

// q, k, v [batch..., len, dim] of one batch shape; mask additive, expanded to [batch..., q_len,
// k_len], or undefined.
template <typename T, typename acc_t>
Operands<T, acc_t> operands_of(const Sizes& sizes, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, bool causal, double scale) {
  Operands<T, acc_t> in{sizes, matrices_of<const T>(q), matrices_of<const T>(k), matrices_of<const T>(v), {},
                        static_cast<acc_t>(scale), causal};
  if (mask.defined()) in.mask = matrices_of<const acc_t>(mask);
  return in;
}

// s <- s * scale + mask, and -inf added from column `visible` on (the causal mask), for one row
// of scores: added, not assigned, so a NaN or +inf score stays NaN as in the unfused ops.
template <typename acc_t>
inline void mask_row(acc_t* s, int64_t cols, acc_t scale, const acc_t* mask, int64_t mask_step, int64_t visible) {
  if (mask != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) s[j] = s[j] * scale + mask[j * mask_step] + (j >= visible ? kMinusInfinity<acc_t> : 0);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) s[j] = s[j] * scale + (j >= visible ? kMinusInfinity<acc_t> : 0);
  }
}

// Runs body(task, scratch) for every task in [0, count) on the intra-op threads, each thread
// taking the next task when it finishes one, with a Scratch of its own. On a shared machine a
// thread that is descheduled then holds up only the task it is in, where at::parallel_for's
// fixed split would leave the others waiting for its whole share.
template <typename Scratch, typename Body>
void run_tasks(int64_t count, const std::function<Scratch()>& make_scratch, const Body& body) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), count);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Scratch scratch = make_scratch();
    for (int64_t task = next++; task < count; task = next++) body(task, scratch);
  });
}

// What a kernel's forward keeps for its backward: the output and one log-sum-exp per query row
// ([batch, q_len], in the accumulation dtype).
struct ForwardResult {
  torch::Tensor out, lse;
};

// The batch shape followed by `last`.
inline std::vector<int64_t> shaped(const torch::Tensor& like, std::initializer_list<int64_t> last) {
  std::vector<int64_t> shape(like.sizes().begin(), like.sizes().end() - 2);
  shape.insert(shape.end(), last);
  return shape;
}

}  // namespace afterburner::kernels::attention_detail
