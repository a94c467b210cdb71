#include "short_attention.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace afterburner::kernels::attention_detail {
namespace {

// Keys held at once: their fp32 rows (k and v, 64 KB at D = 64) and a chunk's scores against
// them stay in L1/L2 while the task's query rows pass over them.
constexpr int64_t kShortKeys = 128;
// bf16 only up to this head dimension: its products are fp32 FMAs here, where oneDNN's bf16 matmuls
// do twice the work an instruction. MultiheadAttention's bf16 core ran 1.0-1.7x slower than the
// kernel at D 8, 2.3x faster at D 64 (BENCHMARKS.md, "Attention over up to 128 keys").
constexpr int64_t kShortBFloat16HeadDim = 16;
// Query rows per forward task: enough tasks for both threads when there are few matrices.
constexpr int64_t kQueryRows = 64;
// Query rows computed together, one per vector lane: 16 (one AVX-512 register), or 8 for a last
// chunk of up to 8 rows (17 rows take 16 + 8 lanes, not 32).
constexpr int kWideRows = 16, kNarrowRows = 8;
// Columns of the outputs summed at once, in registers; the fp32 rows of k, v, q and dO are
// padded with zeros to a multiple of it.
constexpr int kColumns = 8;

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

template <int N>
struct LanesOf {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
};
template <int N>
using Lanes = typename LanesOf<N>::type;  // N fp32 values: N query rows' values, or kColumns columns

template <typename V>
__attribute__((always_inline)) inline V load_lanes(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V>
__attribute__((always_inline)) inline void store_lanes(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

template <typename T>
struct ShortOperands : Operands<T, float> {
  Matrices<const float> dropout;  // factors of the probabilities; data null without
};

// The fp32 scratch of one task; N below is the chunk's lanes (at most kWideRows).
struct ChunkScratch {
  int64_t head_pad, value_pad;   // head_dim and value_dim rounded up to kColumns
  std::vector<float> k, v;       // the matrix's k [k_len, head_pad] and v [k_len, value_pad]
  std::vector<float> qt, dot;    // the chunk's q^T [head_dim, N] and dO^T [value_dim, N]
  std::vector<float> q, dout;    // the chunk's q [N, head_pad] and dO [N, value_pad] (backward)
  std::vector<float> p, ds;      // [k_len, N]: scores, then probabilities (times dropout factors); dS
  std::vector<float> dk, dv;     // [k_len, head_pad], [k_len, value_pad]: the backward's sums
};

// Rows [r0, r0 + rows) of matrix b of m into `to` [rows, pitch], in fp32 (the padding columns
// are left as they are: zero).
template <typename T>
void load_rows(const Matrices<const T>& m, int64_t b, int64_t r0, int64_t rows, int64_t cols, int64_t pitch,
               float* to) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* from = m.row(b, r0 + r);
    for (int64_t c = 0; c < cols; ++c) to[r * pitch + c] = static_cast<float>(from[c * m.col_stride]);
  }
}

// The same rows transposed into `to` [cols, N], the lanes past `rows` zero.
template <int N, typename T>
void load_transposed(const Matrices<const T>& m, int64_t b, int64_t r0, int64_t rows, int64_t cols, float* to) {
  std::fill(to, to + cols * N, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const T* from = m.row(b, r0 + r);
    for (int64_t c = 0; c < cols; ++c) to[c * N + r] = static_cast<float>(from[c * m.col_stride]);
  }
}

// sum_d xt[d] * row[d] for xt [dim, N] (a value per lane) and one row of scalars: two sums,
// halving the chain of dependent additions.
template <int N>
__attribute__((always_inline)) inline Lanes<N> lanes_times_row(const float* xt, const float* row, int64_t dim) {
  Lanes<N> even = {}, odd = {};
  int64_t d = 0;
  for (; d + 1 < dim; d += 2) {
    even += load_lanes<Lanes<N>>(xt + d * N) * row[d];
    odd += load_lanes<Lanes<N>>(xt + (d + 1) * N) * row[d + 1];
  }
  if (d < dim) even += load_lanes<Lanes<N>>(xt + d * N) * row[d];
  return even + odd;
}

// out[c] = sum_j weights[j] * m[j][c] for the chunk's lanes, c < cols: weights [count, N], m
// [count, pitch]; kColumns sums at a time in registers. Each column (N lanes) is handed to
// take(column, values).
template <int N, typename Take>
__attribute__((always_inline)) inline void lanes_times_matrix(const float* weights, const float* m, int64_t count,
                                                              int64_t cols, int64_t pitch, const Take& take) {
  for (int64_t c0 = 0; c0 < cols; c0 += kColumns) {
    Lanes<N> sums[kColumns] = {};
    for (int64_t j = 0; j < count; ++j) {
      const Lanes<N> w = load_lanes<Lanes<N>>(weights + j * N);
      const float* row = m + j * pitch + c0;
      for (int t = 0; t < kColumns; ++t) sums[t] += w * row[t];
    }
    for (int t = 0; t < kColumns && c0 + t < cols; ++t) take(c0 + t, sums[t]);
  }
}

// The lanes as T, rounded all at once: bf16 to nearest even (NaN a quiet NaN), as c10::BFloat16's
// constructor rounds one value.
template <int N>
__attribute__((always_inline)) inline void round_lanes(Lanes<N> values, float* to) {
  store_lanes(to, values);
}

template <int N>
__attribute__((always_inline)) inline void round_lanes(Lanes<N> values, c10::BFloat16* to) {
  const auto halves = simd::bf16_bits(values);
  for (int r = 0; r < N; ++r) to[r] = c10::BFloat16(static_cast<uint16_t>(halves[r]), c10::BFloat16::from_bits());
}

// Column `col` of the chunk's rows [r0, r0 + rows) of matrix b in `to`, from the lanes of `values`.
template <int N, typename T>
__attribute__((always_inline)) inline void store_column(Lanes<N> values, int64_t rows, const Matrices<T>& to,
                                                        int64_t b, int64_t r0, int64_t col) {
  T lanes[N];
  round_lanes<N>(values, lanes);
  for (int64_t r = 0; r < rows; ++r) to.row(b, r0 + r)[col * to.col_stride] = lanes[r];
}

// sum[c] += sum_r weights[r] * m[r][c] for m [rows, pitch]: kColumns sums at a time, held in
// registers across the rows (two, halving the chain of dependent additions).
__attribute__((always_inline)) inline void add_weighted_rows(const float* weights, const float* m, int64_t rows,
                                                             int64_t pitch, float* sum) {
  using Columns = Lanes<kColumns>;
  for (int64_t c = 0; c < pitch; c += kColumns) {
    Columns even = load_lanes<Columns>(sum + c), odd = {};
    int64_t r = 0;
    for (; r + 1 < rows; r += 2) {
      even += weights[r] * load_lanes<Columns>(m + r * pitch + c);
      odd += weights[r + 1] * load_lanes<Columns>(m + (r + 1) * pitch + c);
    }
    if (r < rows) even += weights[r] * load_lanes<Columns>(m + r * pitch + c);
    store_lanes(sum + c, even + odd);
  }
}

// Lane r's value of column j of the rows `rows` points at (0 where null), `step` apart.
template <int N>
__attribute__((always_inline)) inline Lanes<N> gathered(const float* const* rows, int64_t j, int64_t step) {
  float values[N] = {};
  for (int r = 0; r < N; ++r) values[r] = rows[r] != nullptr ? rows[r][j * step] : 0.0f;
  return load_lanes<Lanes<N>>(values);
}

// The chunk's scores against key j, one row per lane: (q . k_j) * scale + mask, plus -inf where
// the causal mask hides the key (added, as the unfused ops add it: NaN and +inf stay NaN).
template <int N, typename T>
__attribute__((always_inline)) inline Lanes<N> scores_against(const ShortOperands<T>& in, const float* qt,
                                                              const float* k_row, int64_t j, Lanes<N> row_index,
                                                              const float* const* mask_rows) {
  Lanes<N> s = lanes_times_row<N>(qt, k_row, in.sizes.head_dim) * in.scale;
  if (in.mask.data != nullptr) s += gathered<N>(mask_rows, j, in.mask.col_stride);
  if (in.causal) s += row_index < static_cast<float>(j) ? Lanes<N>{} + kMinusInfinity<float> : Lanes<N>{};
  return s;
}

// The chunk's row indices as lanes, and its rows' rows of the mask and of the dropout factors
// (null past `rows`, or without them).
template <int N, typename T>
struct ChunkGroupRows {
  Lanes<N> index;
  const float* mask[N] = {};
  const float* dropout[N] = {};

  ChunkGroupRows(const ShortOperands<T>& in, int64_t b, int64_t r0, int64_t rows) {
    for (int r = 0; r < N; ++r) index[r] = static_cast<float>(r0 + r);
    for (int64_t r = 0; in.mask.data != nullptr && r < rows; ++r) mask[r] = in.mask.row(b, r0 + r);
    for (int64_t r = 0; in.dropout.data != nullptr && r < rows; ++r) dropout[r] = in.dropout.row(b, r0 + r);
  }

  // Key j's dropout factors, one per lane.
  Lanes<N> factors(const ShortOperands<T>& in, int64_t j) const {
    return gathered<N>(dropout, j, in.dropout.col_stride);
  }
};

// Rows [r0, r0 + rows) of matrix b, one per lane: out = (softmax(q k^T * scale + mask) * dropout
// factors) v and lse = max + log(sum of exp(score - max)), as the tiled kernel's one key block.
template <int N, typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void forward_chunk(
    const ShortOperands<T>& in, int64_t b, int64_t r0, int64_t rows, ChunkScratch& w, const Matrices<T>& out,
    float* lse) {
  using V = Lanes<N>;
  const Sizes& n = in.sizes;
  const ChunkGroupRows<N, T> chunk(in, b, r0, rows);
  load_transposed<N>(in.q, b, r0, rows, n.head_dim, w.qt.data());
  float* p = w.p.data();
  V largest = V{} + kMinusInfinity<float>;
  for (int64_t j = 0; j < n.k_len; ++j) {
    const V s = scores_against<N>(in, w.qt.data(), w.k.data() + j * w.head_pad, j, chunk.index, chunk.mask);
    store_lanes(p + j * N, s);
    largest = largest > s ? largest : s;
  }
  const V reference = largest == kMinusInfinity<float> ? V{} : largest;  // a row that sees no key: 0/0, NaN
  V sum = {};
  for (int64_t j = 0; j < n.k_len; ++j) {
    const V e = simd::exp_nonpositive(load_lanes<V>(p + j * N) - reference);
    sum += e;
    store_lanes(p + j * N, in.dropout.data != nullptr ? e * chunk.factors(in, j) : e);  // dropped after the sum
  }
  // Every key, so that 0 * inf in v is NaN as in the unfused matmul.
  lanes_times_matrix<N>(p, w.v.data(), n.k_len, n.value_dim, w.value_pad,
                        [&](int64_t col, V values) { store_column<N>(values / sum, rows, out, b, r0, col); });
  float row_lse[N];
  store_lanes(row_lse, largest + simd::log_positive(sum));
  std::copy(row_lse, row_lse + rows, lse + b * n.q_len + r0);
}

// Rows [r0, r0 + rows) of matrix b, one per lane: the probabilities P again from lse, A = P * the
// dropout factors F, dA = dO v^T, dS = P (dA F - dO . O) * scale; their dq = dS k, and dS^T q and
// A^T dO added to dk and dv.
template <int N, typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void backward_chunk(
    const ShortOperands<T>& in, int64_t b, int64_t r0, int64_t rows, const Matrices<const T>& out,
    const float* lse, const Matrices<const T>& out_grad, ChunkScratch& w, const Matrices<T>& dq) {
  using V = Lanes<N>;
  const Sizes& n = in.sizes;
  const ChunkGroupRows<N, T> chunk(in, b, r0, rows);
  load_transposed<N>(in.q, b, r0, rows, n.head_dim, w.qt.data());
  load_transposed<N>(out_grad, b, r0, rows, n.value_dim, w.dot.data());
  load_rows(in.q, b, r0, rows, n.head_dim, w.head_pad, w.q.data());
  load_rows(out_grad, b, r0, rows, n.value_dim, w.value_pad, w.dout.data());
  float deltas[N] = {}, row_lse[N] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const T* o = out.row(b, r0 + r);
    const float* upstream = w.dout.data() + r * w.value_pad;
    for (int64_t d = 0; d < n.value_dim; ++d) deltas[r] += upstream[d] * static_cast<float>(o[d * out.col_stride]);
    row_lse[r] = lse[b * n.q_len + r0 + r];
  }
  const V delta = load_lanes<V>(deltas), lse_lanes = load_lanes<V>(row_lse);
  const auto valid = chunk.index < static_cast<float>(r0 + rows);  // lanes past the last row add nothing
  float *p = w.p.data(), *ds = w.ds.data();
  for (int64_t j = 0; j < n.k_len; ++j) {
    const V s = scores_against<N>(in, w.qt.data(), w.k.data() + j * w.head_pad, j, chunk.index, chunk.mask);
    const V probability = simd::exp_nonpositive(s - lse_lanes);
    V da = lanes_times_row<N>(w.dot.data(), w.v.data() + j * w.value_pad, n.value_dim), dropped = probability;
    if (in.dropout.data != nullptr) {
      const V factors = chunk.factors(in, j);
      dropped *= factors;
      da *= factors;
    }
    store_lanes(p + j * N, valid ? dropped : V{});
    store_lanes(ds + j * N, valid ? probability * (da - delta) * in.scale : V{});
  }
  lanes_times_matrix<N>(ds, w.k.data(), n.k_len, n.head_dim, w.head_pad,
                        [&](int64_t col, V values) { store_column<N>(values, rows, dq, b, r0, col); });
  for (int64_t j = 0; j < n.k_len; ++j) {
    add_weighted_rows(ds + j * N, w.q.data(), rows, w.head_pad, w.dk.data() + j * w.head_pad);
    add_weighted_rows(p + j * N, w.dout.data(), rows, w.value_pad, w.dv.data() + j * w.value_pad);
  }
}

ChunkScratch scratch_for(const Sizes& n, bool backward) {
  ChunkScratch w;
  w.head_pad = round_up(n.head_dim, kColumns);
  w.value_pad = round_up(n.value_dim, kColumns);
  // Zeros: the padding columns stay so; what lies inside is loaded afresh by every task.
  w.k.assign(n.k_len * w.head_pad, 0.0f);
  w.v.assign(n.k_len * w.value_pad, 0.0f);
  w.qt.assign(n.head_dim * kWideRows, 0.0f);
  w.p.assign(n.k_len * kWideRows, 0.0f);
  if (backward) {
    w.dot.assign(n.value_dim * kWideRows, 0.0f);
    w.q.assign(kWideRows * w.head_pad, 0.0f);
    w.dout.assign(kWideRows * w.value_pad, 0.0f);
    w.ds.assign(n.k_len * kWideRows, 0.0f);
    w.dk.assign(n.k_len * w.head_pad, 0.0f);
    w.dv.assign(n.k_len * w.value_pad, 0.0f);
  }
  return w;
}

// Calls f(r0, rows, lanes) for chunks of [q0, q0 + count): kWideRows rows at a time, a last chunk
// of up to kNarrowRows rows in narrower lanes.
template <typename F>
void for_each_chunk(int64_t q0, int64_t count, const F& f) {
  for (int64_t r0 = q0; r0 < q0 + count; r0 += kWideRows) {
    const int64_t rows = std::min<int64_t>(kWideRows, q0 + count - r0);
    if (rows <= kNarrowRows) {
      f(r0, rows, std::integral_constant<int, kNarrowRows>());
    } else {
      f(r0, rows, std::integral_constant<int, kWideRows>());
    }
  }
}

template <typename T>
void load_keys_and_values(const ShortOperands<T>& in, int64_t b, ChunkScratch& w) {
  load_rows(in.k, b, 0, in.sizes.k_len, in.sizes.head_dim, w.head_pad, w.k.data());
  load_rows(in.v, b, 0, in.sizes.k_len, in.sizes.value_dim, w.value_pad, w.v.data());
}

// Matrix b's dk and dv from the sums in w.
template <typename T>
void store_key_gradients(const Sizes& n, const ChunkScratch& w, int64_t b, const Matrices<T>& dk,
                         const Matrices<T>& dv) {
  for (int64_t j = 0; j < n.k_len; ++j) {
    T* dk_row = dk.row(b, j);
    for (int64_t d = 0; d < n.head_dim; ++d) dk_row[d * dk.col_stride] = static_cast<T>(w.dk[j * w.head_pad + d]);
    T* dv_row = dv.row(b, j);
    for (int64_t d = 0; d < n.value_dim; ++d) dv_row[d * dv.col_stride] = static_cast<T>(w.dv[j * w.value_pad + d]);
  }
}

// An uninitialised tensor of `sizes` whose dimensions lie in memory in the order of like's (by
// stride, largest first), unless like is broadcast (a stride 0): MultiheadAttention hands over
// [B, H, L, D] views of [B, L, H, D] and transposes the result straight back, which is then a
// view too.
torch::Tensor empty_in_order_of(const torch::Tensor& like, at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto options = like.options().dtype(dtype);
  for (int64_t d = 0; d < like.dim(); ++d) {
    if (like.stride(d) == 0 && like.size(d) > 1) return at::empty(sizes, options);
  }
  std::vector<int64_t> order(like.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> laid_out, inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    laid_out.push_back(sizes[order[i]]);
    inverse[order[i]] = static_cast<int64_t>(i);
  }
  return at::empty(laid_out, options).permute(inverse);
}

// ---- Matrices across lanes ----
//
// The chunks above hold 16 or 8 query rows: 17 to 20 rows (a vision transformer's 16 patches and
// its class token) take 24 lanes, up to 7 of them empty, and 9 to 12 rows take 16. With heads up
// to 8 wide and many (batch, head) matrices, lane i instead holds matrix b0 + i of a group of 16
// (the layout of MKL's "compact" batched GEMM): no lane is empty but in a last group, every
// product is a whole vector, and no sum crosses lanes. Each group's operands are held
// interleaved, [rows, 8, 16 lanes] in fp32, the padding zero. The ViT of the training suite (17
// rows, 4 heads of 8) trains its epoch 1.13x faster with it (BENCHMARKS.md, "Matrices across
// lanes"); from 24 rows on, where the chunks fill their lanes and the group's operands outgrow
// L1, it measured 0.85-1.05x the chunks' speed at D 8, and at D 16 0.96x.

constexpr int64_t kGroup = simd::kLanes;
constexpr int kGroupDim = 8;  // head and value dimensions up to 8, padded to it
constexpr int64_t kGroupRow = kGroupDim * kGroup;  // floats of an interleaved row
constexpr int64_t kGroupMaxLength = 20;
// At least two groups (one per thread of this machine kind): a fixed count, so that which kernel
// runs, and so the bits, do not depend on the thread count.
constexpr int64_t kGroupMinMatrices = 2 * kGroup;

bool matrices_across_lanes(const Sizes& n) {
  return n.batch >= kGroupMinMatrices && n.head_dim <= kGroupDim && n.value_dim <= kGroupDim &&
         n.q_len <= kGroupMaxLength && n.k_len <= kGroupMaxLength;
}

// The fp32 scratch of one group: [rows, kGroupDim, kGroup] per operand.
struct GroupScratch {
  std::vector<float> q, k, v, dout;  // dout in the backward only
  std::vector<float> dk, dv;         // the backward's sums
  std::vector<float> p;              // [k_len, kGroup]: a row's scores, then probabilities
  std::vector<float> lse, delta;     // [q_len, kGroup]: the forward's lse, dO . O (backward)
};

GroupScratch group_scratch_for(const Sizes& n, bool backward) {
  GroupScratch w;
  w.q.assign(n.q_len * kGroupRow, 0.0f);
  w.k.assign(n.k_len * kGroupRow, 0.0f);
  w.v.assign(n.k_len * kGroupRow, 0.0f);
  w.p.assign(n.k_len * kGroup, 0.0f);
  if (backward) {
    w.dout.assign(n.q_len * kGroupRow, 0.0f);
    w.dk.assign(n.k_len * kGroupRow, 0.0f);
    w.dv.assign(n.k_len * kGroupRow, 0.0f);
    w.lse.assign(n.q_len * kGroup, 0.0f);
    w.delta.assign(n.q_len * kGroup, 0.0f);
  }
  return w;
}

// Rows [0, rows) of matrices b0 .. b0 + count of m into `to` [rows, kGroupDim, kGroup], matrix
// b0 + i in lane i, in fp32; lanes past count zero.
template <typename T>
void load_interleaved(const Matrices<const T>& m, int64_t b0, int64_t count, int64_t rows, int64_t cols,
                      std::vector<float>& to) {
  if (count < kGroup) std::fill(to.begin(), to.end(), 0.0f);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* from = m.row(b0 + i, r);
      float* row = to.data() + r * kGroupRow + i;
      for (int64_t c = 0; c < cols; ++c) row[c * kGroup] = static_cast<float>(from[c * m.col_stride]);
    }
  }
}

template <typename T>
void load_group_operands(const ShortOperands<T>& in, int64_t b0, int64_t count, GroupScratch& w) {
  const Sizes& n = in.sizes;
  load_interleaved(in.q, b0, count, n.q_len, n.head_dim, w.q);
  load_interleaved(in.k, b0, count, n.k_len, n.head_dim, w.k);
  load_interleaved(in.v, b0, count, n.k_len, n.value_dim, w.v);
}

// Lane i of `values` as T into element (r, col) of matrix b0 + i, for the group's count lanes.
template <typename T>
__attribute__((always_inline)) inline void scatter_lanes(simd::Vec values, int64_t count, const Matrices<T>& to,
                                                         int64_t b0, int64_t r, int64_t col) {
  T lanes[kGroup];
  round_lanes<kGroup>(values, lanes);
  for (int64_t i = 0; i < count; ++i) to.row(b0 + i, r)[col * to.col_stride] = lanes[i];
}

// Interleaved rows `from` [rows, kGroupDim, kGroup], their first cols columns, into matrices b0 ..
// b0 + count.
template <typename T>
void store_interleaved(const float* from, int64_t count, int64_t rows, int64_t cols, const Matrices<T>& to,
                       int64_t b0) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      scatter_lanes(simd::load(from + r * kGroupRow + c * kGroup), count, to, b0, r, c);
    }
  }
}

// sum_d a[d] * b[d] lane by lane over interleaved rows: two sums, halving the chain of dependent
// additions (the padding adds 0 * 0).
__attribute__((always_inline)) inline simd::Vec dot_lanes(const float* a, const float* b) {
  simd::Vec even = {}, odd = {};
  for (int d = 0; d < kGroupDim; d += 2) {
    even += simd::load(a + d * kGroup) * simd::load(b + d * kGroup);
    odd += simd::load(a + (d + 1) * kGroup) * simd::load(b + (d + 1) * kGroup);
  }
  return even + odd;
}

// Query row r of the group's matrices, one per lane: its rows of the mask and of the dropout
// factors (null past count, or without them).
template <typename T>
struct LaneRows {
  const float* mask[kGroup] = {};
  const float* dropout[kGroup] = {};

  LaneRows(const ShortOperands<T>& in, int64_t b0, int64_t count, int64_t r) {
    for (int64_t i = 0; in.mask.data != nullptr && i < count; ++i) mask[i] = in.mask.row(b0 + i, r);
    for (int64_t i = 0; in.dropout.data != nullptr && i < count; ++i) dropout[i] = in.dropout.row(b0 + i, r);
  }
};

// Row r's scores against key j, lane by lane: (q . k_j) * scale + mask, plus -inf where the
// causal mask hides the key (added, as the unfused ops add it).
template <typename T>
__attribute__((always_inline)) inline simd::Vec lane_scores(const ShortOperands<T>& in, const float* q_row,
                                                            const float* k_row, int64_t r, int64_t j,
                                                            const LaneRows<T>& rows) {
  simd::Vec s = dot_lanes(q_row, k_row) * in.scale;
  if (in.mask.data != nullptr) s += gathered<kGroup>(rows.mask, j, in.mask.col_stride);
  if (in.causal && j > r) s += kMinusInfinity<float>;
  return s;
}

// Matrices b0 .. b0 + count, one per lane: out = (softmax(q k^T * scale + mask) * dropout
// factors) v and lse = max + log(sum of exp(score - max)), row by row, as forward_chunk.
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void forward_group(
    const ShortOperands<T>& in, int64_t b0, int64_t count, GroupScratch& w, const Matrices<T>& out, float* lse) {
  using V = simd::Vec;
  const Sizes& n = in.sizes;
  load_group_operands(in, b0, count, w);
  float* p = w.p.data();
  for (int64_t r = 0; r < n.q_len; ++r) {
    const LaneRows<T> rows(in, b0, count, r);
    V largest = V{} + kMinusInfinity<float>;
    for (int64_t j = 0; j < n.k_len; ++j) {
      const V s = lane_scores(in, w.q.data() + r * kGroupRow, w.k.data() + j * kGroupRow, r, j, rows);
      simd::store(p + j * kGroup, s);
      largest = largest > s ? largest : s;
    }
    const V reference = largest == kMinusInfinity<float> ? V{} : largest;  // a row that sees no key: 0/0, NaN
    V sum = {}, sums[kGroupDim] = {};
    for (int64_t j = 0; j < n.k_len; ++j) {
      V e = simd::exp_nonpositive(simd::load(p + j * kGroup) - reference);
      sum += e;
      if (in.dropout.data != nullptr) e *= gathered<kGroup>(rows.dropout, j, in.dropout.col_stride);
      const float* v_row = w.v.data() + j * kGroupRow;
      for (int d = 0; d < kGroupDim; ++d) sums[d] += e * simd::load(v_row + d * kGroup);  // every key: 0 * inf is NaN
    }
    for (int64_t d = 0; d < n.value_dim; ++d) scatter_lanes(sums[d] / sum, count, out, b0, r, d);
    float row_lse[kGroup];
    simd::store(row_lse, largest + simd::log_positive(sum));
    for (int64_t i = 0; i < count; ++i) lse[(b0 + i) * n.q_len + r] = row_lse[i];
  }
}

// Each lane's lse and dO . O per query row into w.lse and w.delta [q_len, kGroup] (w.dout loaded).
template <typename T>
void load_row_terms(const Sizes& n, int64_t b0, int64_t count, const Matrices<const T>& out, const float* lse,
                    GroupScratch& w) {
  std::fill(w.lse.begin(), w.lse.end(), 0.0f);
  std::fill(w.delta.begin(), w.delta.end(), 0.0f);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t r = 0; r < n.q_len; ++r) {
      const T* o = out.row(b0 + i, r);
      const float* upstream = w.dout.data() + r * kGroupRow + i;
      float delta = 0;
      for (int64_t d = 0; d < n.value_dim; ++d) {
        delta += upstream[d * kGroup] * static_cast<float>(o[d * out.col_stride]);
      }
      w.delta[r * kGroup + i] = delta;
      w.lse[r * kGroup + i] = lse[(b0 + i) * n.q_len + r];
    }
  }
}

// Matrices b0 .. b0 + count, one per lane, row by row: the probabilities P again from lse, A = P *
// the dropout factors F, dA = dO v^T, dS = P (dA F - dO . O) * scale; dq = dS k, and dS^T q and
// A^T dO summed into dk and dv, as backward_chunk.
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void backward_group(
    const ShortOperands<T>& in, int64_t b0, int64_t count, const Matrices<const T>& out, const float* lse,
    const Matrices<const T>& out_grad, GroupScratch& w, const Matrices<T>& dq, const Matrices<T>& dk,
    const Matrices<T>& dv) {
  using V = simd::Vec;
  const Sizes& n = in.sizes;
  load_group_operands(in, b0, count, w);
  load_interleaved(out_grad, b0, count, n.q_len, n.value_dim, w.dout);
  load_row_terms(n, b0, count, out, lse, w);
  std::fill(w.dk.begin(), w.dk.end(), 0.0f);
  std::fill(w.dv.begin(), w.dv.end(), 0.0f);
  for (int64_t r = 0; r < n.q_len; ++r) {
    const LaneRows<T> rows(in, b0, count, r);
    const float *q_row = w.q.data() + r * kGroupRow, *dout_row = w.dout.data() + r * kGroupRow;
    const V row_lse = simd::load(w.lse.data() + r * kGroup), delta = simd::load(w.delta.data() + r * kGroup);
    V dq_sums[kGroupDim] = {};
    for (int64_t j = 0; j < n.k_len; ++j) {
      const float *k_row = w.k.data() + j * kGroupRow, *v_row = w.v.data() + j * kGroupRow;
      const V probability = simd::exp_nonpositive(lane_scores(in, q_row, k_row, r, j, rows) - row_lse);
      V da = dot_lanes(dout_row, v_row), dropped = probability;
      if (in.dropout.data != nullptr) {
        const V factors = gathered<kGroup>(rows.dropout, j, in.dropout.col_stride);
        dropped *= factors;
        da *= factors;
      }
      const V ds = probability * (da - delta) * in.scale;
      float *dk_row = w.dk.data() + j * kGroupRow, *dv_row = w.dv.data() + j * kGroupRow;
      for (int d = 0; d < kGroupDim; ++d) {
        dq_sums[d] += ds * simd::load(k_row + d * kGroup);
        simd::store(dk_row + d * kGroup, simd::load(dk_row + d * kGroup) + ds * simd::load(q_row + d * kGroup));
        simd::store(dv_row + d * kGroup, simd::load(dv_row + d * kGroup) + dropped * simd::load(dout_row + d * kGroup));
      }
    }
    for (int64_t d = 0; d < n.head_dim; ++d) scatter_lanes(dq_sums[d], count, dq, b0, r, d);
  }
  store_interleaved(w.dk.data(), count, n.k_len, n.head_dim, dk, b0);
  store_interleaved(w.dv.data(), count, n.k_len, n.value_dim, dv, b0);
}

// Runs body(b0, count, scratch) for every group of matrices on the intra-op threads.
template <typename Body>
void for_each_group(const Sizes& n, bool backward, const Body& body) {
  const std::function<GroupScratch()> make_scratch = [&] { return group_scratch_for(n, backward); };
  run_tasks((n.batch + kGroup - 1) / kGroup, make_scratch, [&](int64_t group, GroupScratch& w) {
    body(group * kGroup, std::min(kGroup, n.batch - group * kGroup), w);
  });
}

template <typename T>
void forward_all(const Sizes& n, const ShortOperands<T>& in, const torch::Tensor& out, const torch::Tensor& lse) {
  const Matrices<T> out_rows = matrices_of<T>(out);
  float* lse_data = lse.data_ptr<float>();
  if (matrices_across_lanes(n)) {
    return for_each_group(n, false, [&](int64_t b0, int64_t count, GroupScratch& w) {
      forward_group(in, b0, count, w, out_rows, lse_data);
    });
  }
  const int64_t blocks = (n.q_len + kQueryRows - 1) / kQueryRows;
  const std::function<ChunkScratch()> make_scratch = [&] { return scratch_for(n, false); };
  run_tasks(n.batch * blocks, make_scratch, [&](int64_t task, ChunkScratch& w) {
    const int64_t b = task / blocks, q0 = (task % blocks) * kQueryRows;
    load_keys_and_values(in, b, w);
    for_each_chunk(q0, std::min(kQueryRows, n.q_len - q0), [&](int64_t r0, int64_t rows, auto lanes) {
      forward_chunk<decltype(lanes)::value>(in, b, r0, rows, w, out_rows, lse_data);
    });
  });
}

template <typename T>
void backward_all(const Sizes& n, const ShortOperands<T>& in, const torch::Tensor& out, const torch::Tensor& lse,
                  const torch::Tensor& out_grad, const torch::Tensor& dq, const torch::Tensor& dk,
                  const torch::Tensor& dv) {
  const Matrices<const T> out_rows = matrices_of<const T>(out), upstream = matrices_of<const T>(out_grad);
  const Matrices<T> dq_rows = matrices_of<T>(dq), dk_rows = matrices_of<T>(dk), dv_rows = matrices_of<T>(dv);
  const float* lse_data = lse.data_ptr<float>();
  if (matrices_across_lanes(n)) {
    return for_each_group(n, true, [&](int64_t b0, int64_t count, GroupScratch& w) {
      backward_group(in, b0, count, out_rows, lse_data, upstream, w, dq_rows, dk_rows, dv_rows);
    });
  }
  const std::function<ChunkScratch()> make_scratch = [&] { return scratch_for(n, true); };
  run_tasks(n.batch, make_scratch, [&](int64_t b, ChunkScratch& w) {
    load_keys_and_values(in, b, w);
    std::fill(w.dk.begin(), w.dk.end(), 0.0f);
    std::fill(w.dv.begin(), w.dv.end(), 0.0f);
    for_each_chunk(0, n.q_len, [&](int64_t r0, int64_t rows, auto lanes) {
      backward_chunk<decltype(lanes)::value>(in, b, r0, rows, out_rows, lse_data, upstream, w, dq_rows);
    });
    store_key_gradients(n, w, b, dk_rows, dv_rows);
  });
}

template <typename T>
ShortOperands<T> short_operands(const Sizes& n, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& mask, const torch::Tensor& dropout,
                                bool causal, double scale) {
  ShortOperands<T> in{operands_of<T, float>(n, q, k, v, mask, causal, scale), {}};
  if (dropout.defined()) in.dropout = matrices_of<const float>(dropout);
  return in;
}

}  // namespace

bool short_kernel_applies(const torch::Tensor& q, int64_t k_len) {
  if (k_len > kShortKeys) return false;
  const bool narrow_heads = q.size(-1) <= kShortBFloat16HeadDim;
  return q.scalar_type() == at::kFloat || (q.scalar_type() == at::kBFloat16 && narrow_heads);
}

ForwardResult short_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& mask, const torch::Tensor& dropout, bool causal, double scale) {
  const Sizes n = sizes_of(q, k, v);
  torch::Tensor out = empty_in_order_of(q, shaped(q, {n.q_len, n.value_dim}), q.scalar_type());
  torch::Tensor lse = at::empty({n.batch, n.q_len}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kBFloat16) {
    forward_all(n, short_operands<at::BFloat16>(n, q, k, v, mask, dropout, causal, scale), out, lse);
  } else {
    forward_all(n, short_operands<float>(n, q, k, v, mask, dropout, causal, scale), out, lse);
  }
  return {out, lse};
}

torch::autograd::variable_list short_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                              const torch::Tensor& mask, const torch::Tensor& dropout, bool causal,
                                              double scale,
                                              const torch::Tensor& out, const torch::Tensor& lse,
                                              const torch::Tensor& out_grad) {
  const Sizes n = sizes_of(q, k, v);
  const at::ScalarType dtype = q.scalar_type();
  const torch::Tensor dq = empty_in_order_of(q, q.sizes(), dtype), dk = empty_in_order_of(k, k.sizes(), dtype),
                      dv = empty_in_order_of(v, v.sizes(), dtype);
  const torch::Tensor upstream = out_grad.to(dtype);
  if (dtype == at::kBFloat16) {
    backward_all(n, short_operands<at::BFloat16>(n, q, k, v, mask, dropout, causal, scale), out, lse, upstream, dq, dk,
                 dv);
  } else {
    backward_all(n, short_operands<float>(n, q, k, v, mask, dropout, causal, scale), out, lse, upstream, dq, dk, dv);
  }
  return {dq, dk, dv};
}

}  // namespace afterburner::kernels::attention_detail
