#include "afterburner/kernels/attention.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <oneapi/dnnl/dnnl.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "afterburner/core/cpu.h"
#include "afterburner/core/error.h"
#include "attention_blocks.h"
#include "autocast_argument.h"
#include "short_attention.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using namespace attention_detail;

// Query and key rows per block. A [64, 128] block of scores (32 KB in fp32) and the q, k and v
// rows it comes from stay in L2 through both GEMMs and the softmax between them. At D = 64,
// L = 1,024, 64 x 128, 128 x 128, 64 x 256 and 128 x 256 measured within noise of each other,
// 32 x 128 and 64 x 64 10-20% slower (BENCHMARKS.md, "Fused attention").
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;

// ---- GEMMs on blocks: c [m, n] = op(a) op(b) + beta c, row-major, op transposing where asked. ----

void zero_or_scale(int64_t m, int64_t n, double beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : static_cast<float>(beta) * c[i * ldc + j];
  }
}

// fp32 on oneDNN's sgemm, which runs on the calling thread inside at::parallel_for's OpenMP
// region (measured faster than at::mm_out on the same blocks: BENCHMARKS.md).
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) return zero_or_scale(m, n, beta, c, ldc);
  const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b,
                                          ldb, beta, c, ldc);
  if (status != dnnl_success) throw Error("attention: oneDNN sgemm failed with status " + std::to_string(status));
}

// fp64 (the gradient checks' precision) in plain loops: beta 0 ignores what c held, as BLAS does.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    double* c_row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) c_row[j] = beta == 0 ? 0.0 : beta * c_row[j];
    for (int64_t p = 0; p < k; ++p) {
      const double a_ip = transpose_a ? a[p * lda + i] : a[i * lda + p];
      for (int64_t j = 0; j < n; ++j) c_row[j] += a_ip * (transpose_b ? b[j * ldb + p] : b[p * ldb + j]);
    }
  }
}

// `t` in the accumulation dtype with adjacent columns, as the GEMMs read it: the tensor itself
// when it already is (read only, never written), else a copy.
torch::Tensor gemm_ready(const torch::Tensor& t, at::ScalarType acc) {
  torch::Tensor ready = t.to(acc);
  const bool rows_apart = t.size(-2) <= 1 || ready.stride(-2) >= std::max<int64_t>(1, ready.size(-1));
  return ready.stride(-1) == 1 && rows_apart ? ready : ready.contiguous();
}

template <typename acc_t>
struct TiledOperands : Operands<acc_t, acc_t> {
  bool skip_hidden_blocks;  // leave out blocks the causal mask hides entirely (hidden_blocks_skippable)

  // Columns [0, visible) of the key block at k0 are visible to query row `row`, the rest causal-masked.
  int64_t visible(int64_t row, int64_t k0, int64_t cols) const {
    return this->causal ? std::clamp<int64_t>(row - k0 + 1, 0, cols) : cols;
  }
  const acc_t* mask_row(int64_t b, int64_t row, int64_t k0) const {
    return this->mask.data ? this->mask.row(b, row) + k0 * this->mask.col_stride : nullptr;
  }
};

// ---- The block computations, vectorised per row (one clone per instruction set) ----

// Folds a block of scores [rows, cols] into the rows' running softmax (FlashAttention's online
// softmax): max and sum become those over every key so far, the scores become exp(s - max), and
// what each row accumulated (acc [rows, value_dim]) is rescaled by exp(old max - new max). A row
// that has seen only -inf keeps max -inf and sum 0 (its exps taken against 0, since -inf - -inf
// is NaN) and ends 0/0 = NaN, as softmax of all -inf does; a NaN or +inf score makes its exp, and
// so the row, NaN, as in softmax.
template <typename acc_t>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void fold_block(
    const TiledOperands<acc_t>& in, int64_t b, int64_t q0, int64_t k0, int64_t rows, int64_t cols, acc_t* scores,
    acc_t* max, acc_t* sum, acc_t* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    acc_t* s = scores + r * cols;
    mask_row(s, cols, in.scale, in.mask_row(b, q0 + r, k0), in.mask.col_stride, in.visible(q0 + r, k0, cols));
    acc_t block_max = kMinusInfinity<acc_t>;
#pragma omp simd reduction(max : block_max)
    for (int64_t j = 0; j < cols; ++j) block_max = std::max(block_max, s[j]);
    const acc_t new_max = std::max(max[r], block_max);
    const acc_t reference = new_max == kMinusInfinity<acc_t> ? 0 : new_max;
    acc_t block_sum = 0;
#pragma omp simd reduction(+ : block_sum)
    for (int64_t j = 0; j < cols; ++j) {
      s[j] = exp_of(s[j] - reference);
      block_sum += s[j];
    }
    const acc_t rescale = exp_of(max[r] - reference);
    sum[r] = sum[r] * rescale + block_sum;
    max[r] = new_max;
    acc_t* acc_row = acc + r * in.sizes.value_dim;
#pragma omp simd
    for (int64_t d = 0; d < in.sizes.value_dim; ++d) acc_row[d] *= rescale;
  }
}

// The block's probabilities from the forward's log-sum-exp: p = exp(s * scale + mask - lse).
// A row whose lse is -inf (it saw no key) gets -inf - -inf = NaN, as its softmax was.
template <typename acc_t>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void probabilities_block(
    const TiledOperands<acc_t>& in, int64_t b, int64_t q0, int64_t k0, int64_t rows, int64_t cols, const acc_t* lse,
    acc_t* scores) {
  for (int64_t r = 0; r < rows; ++r) {
    acc_t* s = scores + r * cols;
    mask_row(s, cols, in.scale, in.mask_row(b, q0 + r, k0), in.mask.col_stride, in.visible(q0 + r, k0, cols));
    const acc_t row_lse = lse[r];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) s[j] = exp_of(s[j] - row_lse);
  }
}

// dS = P (dP - delta) * scale, in place of dP: softmax's backward (delta_i = sum_j dP_ij P_ij =
// dO_i . O_i), then the scale's.
template <typename acc_t>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void score_gradients_block(
    int64_t rows, int64_t cols, const acc_t* p, const acc_t* delta, acc_t scale, acc_t* dp) {
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) dp[r * cols + j] = p[r * cols + j] * (dp[r * cols + j] - delta[r]) * scale;
  }
}

// ---- Forward ----

// Output rows [q0, q0 + rows) of batch b, and their log-sum-exp, over key blocks with the
// online softmax; out and lse point at row q0.
template <typename acc_t>
void forward_query_block(const TiledOperands<acc_t>& in, int64_t b, int64_t q0, std::vector<acc_t>& scores,
                         std::vector<acc_t>& acc, acc_t* out, acc_t* lse) {
  const Sizes& n = in.sizes;
  const int64_t rows = std::min(kQueryBlock, n.q_len - q0);
  std::vector<acc_t> max(rows, kMinusInfinity<acc_t>), sum(rows, 0);
  std::fill(acc.begin(), acc.end(), acc_t(0));
  // Keys past the block's last row are hidden from all its rows by the causal mask.
  const int64_t key_end = in.skip_hidden_blocks ? std::min(n.k_len, q0 + rows) : n.k_len;
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
    const int64_t cols = std::min(kKeyBlock, n.k_len - k0);
    gemm(false, true, rows, cols, n.head_dim, in.q.row(b, q0), in.q.row_stride, in.k.row(b, k0), in.k.row_stride, 0,
         scores.data(), cols);
    fold_block(in, b, q0, k0, rows, cols, scores.data(), max.data(), sum.data(), acc.data());
    gemm(false, false, rows, n.value_dim, cols, scores.data(), cols, in.v.row(b, k0), in.v.row_stride, 1, acc.data(),
         n.value_dim);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < n.value_dim; ++d) out[r * n.value_dim + d] = acc[r * n.value_dim + d] / sum[r];
    lse[r] = max[r] + std::log(sum[r]);
  }
}

// out [batch, q_len, value_dim] and lse [batch, q_len], both fresh and contiguous; tasks are
// (batch, query block) pairs.
template <typename acc_t>
void forward_all_blocks(const TiledOperands<acc_t>& in, acc_t* out, acc_t* lse) {
  const Sizes& n = in.sizes;
  const int64_t blocks = (n.q_len + kQueryBlock - 1) / kQueryBlock;
  using Scratch = std::pair<std::vector<acc_t>, std::vector<acc_t>>;  // scores, accumulated rows
  const std::function<Scratch()> make_scratch = [&] {
    return Scratch(std::vector<acc_t>(kQueryBlock * kKeyBlock), std::vector<acc_t>(kQueryBlock * n.value_dim));
  };
  run_tasks(n.batch * blocks, make_scratch, [&](int64_t task, Scratch& scratch) {
    const int64_t b = task / blocks, q0 = (task % blocks) * kQueryBlock;
    const int64_t row = b * n.q_len + q0;
    forward_query_block(in, b, q0, scratch.first, scratch.second, out + row * n.value_dim, lse + row);
  });
}

// ---- Backward ----

template <typename acc_t>
struct Gradients {
  Matrices<const acc_t> out_grad;  // dO
  const acc_t* lse;                // [batch, q_len]
  const acc_t* delta;              // [batch, q_len]: dO_i . O_i
  acc_t *dq, *dk, *dv;             // contiguous [batch, len, dim]; dq of this task's share
};

// Adds key block k0's share to dq and writes its rows of dk and dv, recomputing the probabilities
// of every query block that sees it (FlashAttention-2).
template <typename acc_t>
void backward_key_block(const TiledOperands<acc_t>& in, const Gradients<acc_t>& g, int64_t b, int64_t k0,
                        std::vector<acc_t>& p, std::vector<acc_t>& dp) {
  const Sizes& n = in.sizes;
  const int64_t cols = std::min(kKeyBlock, n.k_len - k0);
  acc_t* dk = g.dk + (b * n.k_len + k0) * n.head_dim;
  acc_t* dv = g.dv + (b * n.k_len + k0) * n.value_dim;
  // Query rows before k0 see none of these keys under the causal mask.
  const int64_t q_begin = in.skip_hidden_blocks ? k0 / kQueryBlock * kQueryBlock : 0;
  for (int64_t q0 = q_begin; q0 < n.q_len; q0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, n.q_len - q0), row = b * n.q_len + q0;
    const acc_t* q = in.q.row(b, q0);
    const acc_t* out_grad = g.out_grad.row(b, q0);
    gemm(false, true, rows, cols, n.head_dim, q, in.q.row_stride, in.k.row(b, k0), in.k.row_stride, 0, p.data(), cols);
    probabilities_block(in, b, q0, k0, rows, cols, g.lse + row, p.data());
    gemm(true, false, cols, n.value_dim, rows, p.data(), cols, out_grad, g.out_grad.row_stride, 1, dv, n.value_dim);
    gemm(false, true, rows, cols, n.value_dim, out_grad, g.out_grad.row_stride, in.v.row(b, k0), in.v.row_stride, 0,
         dp.data(), cols);
    score_gradients_block(rows, cols, p.data(), g.delta + row, in.scale, dp.data());
    gemm(false, false, rows, n.head_dim, cols, dp.data(), cols, in.k.row(b, k0), in.k.row_stride, 1,
         g.dq + row * n.head_dim, n.head_dim);
    gemm(true, false, cols, n.head_dim, rows, dp.data(), cols, q, in.q.row_stride, 1, dk, n.head_dim);
  }
}

// Tasks are (batch, share) pairs, share s taking key blocks s, s + shares, ...: each batch's dk and
// dv rows have one writer, and each share its own dq [batch, q_len, head_dim] (the s-th of
// g.dq's `shares`), summed afterwards. One share per batch unless there are fewer batches than
// threads.
template <typename acc_t>
void backward_all_blocks(const TiledOperands<acc_t>& in, Gradients<acc_t> g, int64_t shares) {
  const Sizes& n = in.sizes;
  const int64_t key_blocks = (n.k_len + kKeyBlock - 1) / kKeyBlock;
  using Scratch = std::pair<std::vector<acc_t>, std::vector<acc_t>>;  // probabilities, their gradients
  const std::function<Scratch()> make_scratch = [&] {
    return Scratch(std::vector<acc_t>(kQueryBlock * kKeyBlock), std::vector<acc_t>(kQueryBlock * kKeyBlock));
  };
  run_tasks(n.batch * shares, make_scratch, [&](int64_t task, Scratch& scratch) {
    const int64_t b = task / shares, share = task % shares;
    Gradients<acc_t> mine = g;
    mine.dq = g.dq + share * n.batch * n.q_len * n.head_dim;
    for (int64_t block = share; block < key_blocks; block += shares) {
      backward_key_block(in, mine, b, block * kKeyBlock, scratch.first, scratch.second);
    }
  });
}

int64_t dq_shares(const Sizes& n) {
  const int64_t key_blocks = (n.k_len + kKeyBlock - 1) / kKeyBlock;
  const int64_t threads = at::get_num_threads();
  return n.batch >= threads ? 1 : std::clamp<int64_t>((threads + n.batch - 1) / n.batch, 1, key_blocks);
}

// ---- Tensors in, tensors out ----

at::ScalarType accumulation_dtype(const torch::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// `t` without the repeats its broadcast (stride-0) dimensions show: each element once.
torch::Tensor distinct_elements(torch::Tensor t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && t.size(d) > 1) t = t.narrow(d, 0, 1);
  }
  return t;
}

double largest(const torch::Tensor& t) { return t.numel() == 0 ? 0.0 : distinct_elements(t).max().item<double>(); }
double largest_magnitude(const torch::Tensor& t) { return largest(distinct_elements(t).abs()); }

// Whether a block of scores the causal mask hides entirely may be left out. Computed, its
// probabilities are exactly 0 and add nothing, unless a score there is NaN or +inf before the
// -inf (q k^T * scale overflowing, a NaN or +inf in q, k or the mask) or 0 meets a NaN or
// infinity in v or in the gradients (0 * inf is NaN): then every block is computed, as the
// unfused ops compute every score. The bounds are on magnitudes, so NaN fails them.
constexpr double kSafe = 1e37;  // well inside fp32: a sum of two such magnitudes stays finite

bool hidden_blocks_skippable(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, double scale) {
  const double score_bound = largest_magnitude(q) * largest_magnitude(k) * q.size(-1) * std::abs(scale);
  const double mask_bound = mask.defined() ? largest(mask) : 0.0;
  return std::isfinite(scale) && score_bound < kSafe && mask_bound < kSafe && largest_magnitude(v) < kSafe;
}

bool hidden_blocks_skippable_in_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const torch::Tensor& mask, double scale, const torch::Tensor& out_grad,
                                         const torch::Tensor& lse) {
  const double gradient_bound = largest_magnitude(out_grad) * largest_magnitude(v) * v.size(-1);
  return hidden_blocks_skippable(q, k, v, mask, scale) && gradient_bound < kSafe && lse.isfinite().all().item<bool>();
}

template <typename acc_t>
TiledOperands<acc_t> tiled_operands(const Sizes& sizes, const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const torch::Tensor& mask, bool causal, double scale,
                                    bool skip_hidden_blocks) {
  return {operands_of<acc_t, acc_t>(sizes, q, k, v, mask, causal, scale), skip_hidden_blocks};
}

// q, k, v [batch..., len, dim] of one batch shape and dtype; mask additive in the accumulation
// dtype, expanded to [batch..., q_len, k_len], or undefined.
ForwardResult tiled_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& mask, bool causal, double scale) {
  const at::ScalarType acc = accumulation_dtype(q);
  const Sizes n = sizes_of(q, k, v);
  const torch::Tensor q_ready = gemm_ready(q, acc), k_ready = gemm_ready(k, acc), v_ready = gemm_ready(v, acc);
  const bool skip = causal && hidden_blocks_skippable(q_ready, k_ready, v_ready, mask, scale);
  torch::Tensor out = at::empty(shaped(q, {n.q_len, n.value_dim}), q.options().dtype(acc));
  torch::Tensor lse = at::empty({n.batch, n.q_len}, q.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES(acc, "attention", [&] {
    forward_all_blocks(tiled_operands<scalar_t>(n, q_ready, k_ready, v_ready, mask, causal, scale, skip),
                       out.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>());
  });
  return {out.to(q.scalar_type()), lse};
}

variable_list tiled_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, bool causal, double scale, const torch::Tensor& out,
                             const torch::Tensor& lse, const torch::Tensor& out_grad) {
  const at::ScalarType acc = accumulation_dtype(q);
  const Sizes n = sizes_of(q, k, v);
  const torch::Tensor q_ready = gemm_ready(q, acc), k_ready = gemm_ready(k, acc), v_ready = gemm_ready(v, acc);
  const torch::Tensor out_grad_ready = gemm_ready(out_grad, acc);
  const bool skip = causal && hidden_blocks_skippable_in_backward(q_ready, k_ready, v_ready, mask, scale,
                                                                  out_grad_ready, lse);
  const torch::Tensor delta = (out_grad_ready * out.to(acc)).sum(-1).reshape({n.batch, n.q_len}).contiguous();
  const int64_t shares = dq_shares(n);
  torch::Tensor dq = at::zeros({shares, n.batch, n.q_len, n.head_dim}, q.options().dtype(acc));
  torch::Tensor dk = at::zeros(shaped(k, {n.k_len, n.head_dim}), q.options().dtype(acc));
  torch::Tensor dv = at::zeros(shaped(v, {n.k_len, n.value_dim}), q.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES(acc, "attention_backward", [&] {
    const Gradients<scalar_t> g{matrices_of<const scalar_t>(out_grad_ready), lse.data_ptr<scalar_t>(),
                                delta.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dk.data_ptr<scalar_t>(),
                                dv.data_ptr<scalar_t>()};
    backward_all_blocks(tiled_operands<scalar_t>(n, q_ready, k_ready, v_ready, mask, causal, scale, skip), g, shares);
  });
  const torch::Tensor dq_total = shares == 1 ? dq[0] : dq.sum(0);
  const auto dtype = q.scalar_type();
  return {dq_total.view(shaped(q, {n.q_len, n.head_dim})).to(dtype), dk.to(dtype), dv.to(dtype)};
}

// ---- The unfused composition ----

// softmax(q k^T * scale + mask + causal mask) in LibTorch's ops, in the accumulation dtype: what
// the kernel computes, run where its result is differentiated again (create_graph) and for empty
// sequences.
torch::Tensor unfused_probabilities_of_scores(torch::Tensor scores, const torch::Tensor& mask, bool causal) {
  if (mask.defined()) scores = scores + mask;
  if (causal) {
    const torch::Tensor visible =
        at::ones({scores.size(-2), scores.size(-1)}, scores.options().dtype(at::kBool)).tril();
    scores = scores + at::zeros(visible.sizes(), scores.options()).masked_fill_(visible.logical_not(), -INFINITY);
  }
  return at::softmax(scores, -1);
}

torch::Tensor unfused_probabilities(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& mask,
                                    bool causal, double scale) {
  const at::ScalarType acc = accumulation_dtype(q);
  return unfused_probabilities_of_scores(at::matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale, mask, causal);
}

// The probabilities times the dropout factors, where there are any.
torch::Tensor dropped(const torch::Tensor& p, const torch::Tensor& dropout) {
  return dropout.defined() ? p * dropout : p;
}

torch::Tensor unfused_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& mask, const torch::Tensor& dropout, bool causal, double scale) {
  const torch::Tensor p = dropped(unfused_probabilities(q, k, mask, causal, scale), dropout);
  return at::matmul(p, v.to(p.scalar_type())).to(q.scalar_type());
}

// The same gradients as the kernels', in LibTorch's differentiable ops: with A = P * dropout, dA =
// dO v^T, dP = dA * dropout, dS = P (dP - sum(dP P)) * scale (the sum is dO . O).
variable_list unfused_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& mask, const torch::Tensor& dropout, bool causal, double scale,
                               const torch::Tensor& out_grad) {
  const torch::Tensor p = unfused_probabilities(q, k, mask, causal, scale);
  const at::ScalarType acc = p.scalar_type(), dtype = q.scalar_type();
  const torch::Tensor dout = out_grad.to(acc);
  const torch::Tensor dp = dropped(at::matmul(dout, v.to(acc).transpose(-2, -1)), dropout);
  const torch::Tensor ds = p * (dp - (dp * p).sum(-1, true)) * scale;
  return {at::matmul(ds, k.to(acc)).to(dtype), at::matmul(ds.transpose(-2, -1), q.to(acc)).to(dtype),
          at::matmul(dropped(p, dropout).transpose(-2, -1), dout).to(dtype)};
}

// softmax(q k^T * scale + mask + causal mask) v for bf16 q, k, v with LibTorch's bf16 matmuls
// (oneDNN's AVX512-BF16 kernels, fp32 accumulation, the scores rounded to bf16 as
// MultiheadAttention's own are under autocast), scale, mask and softmax in fp32; autograd
// differentiates the ops. The softmax stays fp32 (not LibTorch's faster bf16 kernel) for its
// backward: with bf16 probabilities, whose rows do not sum to 1, p * (dp - sum(dp * p)) leaves up
// to 4% of the gradients' scale where they cancel to 0 (keys and values alike).
torch::Tensor bf16_composition(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& mask, const torch::Tensor& dropout, bool causal, double scale) {
  const torch::Tensor p = unfused_probabilities_of_scores(at::matmul(q, k.transpose(-2, -1)).to(at::kFloat) * scale,
                                                          mask, causal);
  return at::matmul(dropped(p, dropout).to(at::kBFloat16), v);
}

// Where LibTorch's bf16 matmuls outrun the kernel, whose block GEMMs run in fp32: bf16 on a CPU
// that computes it natively, below 1,024 x 1,024 scores (the kernel ran at 0.5-0.7x the speed of
// MultiheadAttention's core at L 17 to 256 and tied it at 1,024; BENCHMARKS.md, Fused attention).
bool bf16_composition_is_faster(const torch::Tensor& q, int64_t q_len, int64_t k_len) {
  constexpr int64_t kTiledFromScores = 1024 * 1024;
  return q.scalar_type() == at::kBFloat16 && q_len * k_len < kTiledFromScores && cpu_has_native_bf16();
}

// ---- The autograd node ----

struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  // The tiled kernel takes no dropout factors (attention() sends those to the composition).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const c10::optional<torch::Tensor>& mask,
                               const c10::optional<torch::Tensor>& dropout, bool causal, double scale) {
    const torch::Tensor additive = mask.value_or(torch::Tensor()), factors = dropout.value_or(torch::Tensor());
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    if (k.size(-2) == 0 || q.size(-2) == 0 || v.size(-1) == 0) {  // nothing to tile: the composition's zeros
      ctx->save_for_backward({q, k, v, additive, factors, torch::Tensor(), torch::Tensor()});
      return unfused_attention(q, k, v, additive, factors, causal, scale);
    }
    const ForwardResult result = short_kernel_applies(q, k.size(-2))
                                     ? short_forward(q, k, v, additive, factors, causal, scale)
                                     : tiled_forward(q, k, v, additive, causal, scale);
    ctx->save_for_backward({q, k, v, additive, factors, result.out, result.lse});
    return result.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &mask = saved[3], &dropout = saved[4];
    const torch::Tensor &out = saved[5], &lse = saved[6];
    const bool causal = ctx->saved_data["causal"].toBool();
    const double scale = ctx->saved_data["scale"].toDouble();
    // Under create_graph (grad mode on) the gradients are differentiated again, which the kernel's,
    // written through data_ptr, would silently not be.
    const variable_list grads =
        torch::GradMode::is_enabled() || !lse.defined()
            ? unfused_backward(q, k, v, mask, dropout, causal, scale, grad_outputs[0])
        : short_kernel_applies(q, k.size(-2))
            ? short_backward(q, k, v, mask, dropout, causal, scale, out, lse, grad_outputs[0])
            : tiled_backward(q, k, v, mask, causal, scale, out, lse, grad_outputs[0]);
    return {grads[0], grads[1], grads[2], torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// ---- Arguments ----

std::string describe(const torch::Tensor& t) {
  return t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + c10::str(t.sizes()) : "undefined";
}

void check_operand(const torch::Tensor& t, const char* name) {
  if (!t.defined() || t.dim() < 2) {
    throw UsageError(std::string("attention ") + name, "expected [..., length, dim], got " + describe(t));
  }
  if (!t.device().is_cpu()) throw UsageError(std::string("attention ") + name, "CPU tensors only, got " + c10::str(t.device()));
  const auto dtype = t.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kBFloat16) {
    throw UsageError(std::string("attention ") + name, "dtype " + describe(t) + " is not supported (float, double or bfloat16)");
  }
}

void check_operands(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  check_operand(q, "query");
  check_operand(k, "key");
  check_operand(v, "value");
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) {
    throw UsageError("attention", "query, key and value must have one dtype, got " + describe(q) + ", " + describe(k) +
                                      " and " + describe(v));
  }
  if (q.size(-1) == 0 || k.size(-1) != q.size(-1)) {
    throw UsageError("attention key", "expected [..., length, " + std::to_string(q.size(-1)) +
                                          "] to match the query (a non-empty head dimension), got " + describe(k));
  }
  if (v.size(-2) != k.size(-2)) {
    throw UsageError("attention value", "expected " + std::to_string(k.size(-2)) + " rows like the key, got " + describe(v));
  }
}

// The leading dimensions q, k, v and the masks broadcast to.
std::vector<int64_t> batch_shape(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& mask, const torch::Tensor& dropout) {
  const auto leading = [](const torch::Tensor& t) { return t.sizes().slice(0, std::max<int64_t>(0, t.dim() - 2)); };
  try {
    std::vector<int64_t> shape = at::infer_size(at::infer_size(leading(q), leading(k)), leading(v));
    if (mask.defined()) shape = at::infer_size(shape, leading(mask));
    return dropout.defined() ? at::infer_size(shape, leading(dropout)) : shape;
  } catch (const c10::Error&) {
    throw UsageError("attention", "the leading dimensions of query " + describe(q) + ", key " + describe(k) +
                                      ", value " + describe(v) + (mask.defined() ? ", attn_mask " + describe(mask) : "") +
                                      (dropout.defined() ? ", dropout_mask " + describe(dropout) : "") +
                                      " do not broadcast");
  }
}

// `mask` (attn_mask or dropout_mask, named `name`) checked: a floating-point CPU tensor (or bool,
// where it takes one), requiring no grad, broadcasting to the scores [..., q_len, k_len];
// returned at least 2-D.
torch::Tensor checked_mask(const torch::Tensor& mask, int64_t q_len, int64_t k_len, const std::string& name,
                           bool takes_bool) {
  const bool dtype_taken = at::isFloatingType(mask.scalar_type()) || (takes_bool && mask.scalar_type() == at::kBool);
  if (!mask.device().is_cpu() || !dtype_taken) {
    throw UsageError(name, std::string("expected a ") + (takes_bool ? "bool or " : "") +
                               "floating-point CPU tensor, got " + describe(mask));
  }
  if (mask.requires_grad() && torch::GradMode::is_enabled()) {
    throw UsageError(name, "gets no gradient: detach it (it requires grad)");
  }
  torch::Tensor m = mask;
  while (m.dim() < 2) m = m.unsqueeze(0);
  if ((m.size(-2) != 1 && m.size(-2) != q_len) || (m.size(-1) != 1 && m.size(-1) != k_len)) {
    throw UsageError(name, "expected [..., " + std::to_string(q_len) + " or 1, " + std::to_string(k_len) +
                               " or 1] to broadcast to the scores, got " + describe(mask));
  }
  return m;
}

// attn_mask as an additive mask in the accumulation dtype (bool: 0 where true, -inf where false).
torch::Tensor additive_mask(const torch::Tensor& mask, int64_t q_len, int64_t k_len, at::ScalarType acc) {
  const torch::Tensor m = checked_mask(mask, q_len, k_len, "attention attn_mask", true);
  if (m.scalar_type() != at::kBool) return m.to(acc);
  return at::zeros(m.sizes(), m.options().dtype(acc)).masked_fill_(m.logical_not(), -INFINITY);
}

std::vector<int64_t> with_last(std::vector<int64_t> shape, int64_t rows, int64_t cols) {
  shape.push_back(rows);
  shape.push_back(cols);
  return shape;
}

}  // namespace

torch::Tensor attention(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                        const c10::optional<torch::Tensor>& attn_mask, bool causal, c10::optional<double> scale,
                        const c10::optional<torch::Tensor>& dropout_mask) {
  check_operand(q_in, "query");
  check_operand(k_in, "key");
  check_operand(v_in, "value");
  const torch::Tensor q = autocast_argument(q_in), k = autocast_argument(k_in), v = autocast_argument(v_in);
  check_operands(q, k, v);
  const int64_t q_len = q.size(-2), k_len = k.size(-2);
  const at::ScalarType acc = accumulation_dtype(q);
  const auto given = [](const c10::optional<torch::Tensor>& t) { return t && t->defined(); };
  const torch::Tensor mask = given(attn_mask) ? additive_mask(*attn_mask, q_len, k_len, acc) : torch::Tensor();
  const torch::Tensor dropout =
      given(dropout_mask) ? checked_mask(*dropout_mask, q_len, k_len, "attention dropout_mask", false).to(acc)
                          : torch::Tensor();
  const std::vector<int64_t> batch = batch_shape(q, k, v, mask, dropout);
  const auto expanded = [&](const torch::Tensor& m) {
    return m.defined() ? c10::make_optional(m.expand(with_last(batch, q_len, k_len))) : c10::nullopt;
  };
  const double softmax_scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (!short_kernel_applies(q, k_len)) {
    if (bf16_composition_is_faster(q, q_len, k_len)) {
      return bf16_composition(q, k, v, mask, dropout, causal, softmax_scale);
    }
    if (dropout.defined()) return unfused_attention(q, k, v, mask, dropout, causal, softmax_scale);
  }
  return AttentionFunction::apply(q.expand(with_last(batch, q_len, q.size(-1))),
                                  k.expand(with_last(batch, k_len, k.size(-1))),
                                  v.expand(with_last(batch, k_len, v.size(-1))), expanded(mask), expanded(dropout),
                                  causal, softmax_scale);
}

}  // namespace afterburner::kernels
