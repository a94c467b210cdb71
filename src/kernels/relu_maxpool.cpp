#include "afterburner/kernels/relu_maxpool.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/onednn_tensor.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <int64_t N>
using Fixed = std::integral_constant<int64_t, N>;

// The winner record of a window whose max is <= 0: ReLU zeroed the output, so no gradient.
constexpr uint8_t kNoWinner = 255;
// Window positions 0 .. kernel*kernel-1 are stored in a byte and must stay below kNoWinner.
constexpr int64_t kMaxFastKernel = 15;
// Windows per vector: a wide block is one AVX2 register of fp32; a narrow one fits a 7-wide row.
constexpr int64_t kWideBlock = 8;
constexpr int64_t kNarrowBlock = 4;
// Input elements below which a parallel chunk is not worth a thread (ATen's GRAIN_SIZE).
constexpr int64_t kGrainElements = 32768;

// N lanes of T in one SIMD value (GCC vector extension): GCC's auto-vectorizer leaves these
// compare-and-select loops as branches, and ATen's Vectorized<float> is scalar code without ATen's
// per-ISA build flags. Each target_clones clone lowers the same code to its own instruction set.
// Vectors pass only by reference between the inlined helpers below, so no vector-passing ABI is
// involved. (The struct is needed: an alias template drops the attribute.)
template <typename T, int64_t N>
struct VecOf {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
template <typename T, int64_t N>
using Vec = typename VecOf<T, N>::type;

// The forward kernels see bf16 as its raw bits and the backward kernels every gradient as bits:
// selecting and copying bits is exact.
template <typename scalar_t>
using Storage = std::conditional_t<std::is_same_v<scalar_t, c10::BFloat16>, uint16_t, scalar_t>;
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;

// Comparisons run in fp32 for bf16 (exact: bf16 is the top half of an fp32), else in T.
template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, uint16_t>, float, T>;
// The lane mask type of a comparison of Compute<T> values.
template <typename T>
using Mask = std::conditional_t<sizeof(Compute<T>) == 4, int32_t, int64_t>;

template <typename T, int64_t N>
inline void widen(const Vec<T, N>& in, Vec<Compute<T>, N>& out) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    out = reinterpret_cast<Vec<float, N>>(__builtin_convertvector(in, Vec<uint32_t, N>) << 16);
  } else {
    out = in;
  }
}

// Exact for values that came from widen: their low 16 bits are 0.
template <typename T, int64_t N>
inline void narrow(const Vec<Compute<T>, N>& in, Vec<T, N>& out) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    out = __builtin_convertvector(reinterpret_cast<Vec<uint32_t, N>>(in) >> 16, Vec<uint16_t, N>);
  } else {
    out = in;
  }
}

// A block is either a compile-time number of lanes that fills its vector (Fixed<N>), or, for rows
// shorter than kNarrowBlock, a runtime count whose vector repeats the last lane.
template <typename Lanes>
constexpr int64_t vector_width = Lanes::value;
template <>
constexpr int64_t vector_width<int64_t> = kNarrowBlock;
template <typename Lanes>
constexpr bool is_full = !std::is_same_v<Lanes, int64_t>;
// Room for one window row of vectors.
template <typename Kernel>
constexpr int64_t max_kernel = Kernel::value;
template <>
constexpr int64_t max_kernel<int64_t> = kMaxFastKernel;

template <typename T, int64_t N, typename Lanes>
inline void load_contiguous(const T* from, Lanes lanes, Vec<T, N>& v) {
  if constexpr (is_full<Lanes>) {
    std::memcpy(&v, from, sizeof v);
  } else {
    std::array<T, N> gathered;
    for (int64_t j = 0; j < N; ++j) gathered[j] = from[std::min<int64_t>(j, lanes - 1)];
    std::memcpy(&v, gathered.data(), sizeof v);
  }
}

template <typename T, int64_t N, typename Lanes>
inline void store_contiguous(T* to, Lanes lanes, const Vec<T, N>& v) {
  if constexpr (is_full<Lanes>) {
    std::memcpy(to, &v, sizeof v);
  } else {
    for (int64_t j = 0; j < lanes; ++j) to[j] = v[j];
  }
}

// The low byte of each lane (GCC lowers __builtin_convertvector to bytes one lane at a time).
template <typename M, int64_t N, size_t... I>
inline void low_bytes(const Vec<M, N>& in, Vec<uint8_t, N>& out, std::index_sequence<I...>) {
  const auto bytes = reinterpret_cast<Vec<uint8_t, N * sizeof(M)>>(in);
  out = __builtin_shufflevector(bytes, bytes, (I * sizeof(M))...);
}

// Each byte zero-extended to its lane: one byte shuffle of the bytes loaded as a word (GCC lowers
// __builtin_convertvector from bytes one lane at a time, and a vector built from a smaller one
// through memory stalls on store forwarding).
template <typename U, int64_t N, size_t... I>
inline void zero_extend_bytes(const Vec<uint8_t, N>& in, Vec<U, N>& out, std::index_sequence<I...>) {
  static_assert(N <= 8, "the bytes must fit one word");
  uint64_t word = 0;
  std::memcpy(&word, &in, N);
  Vec<uint64_t, N * sizeof(U) / 8> words = {};
  words[0] = word;
  const auto bytes = reinterpret_cast<Vec<uint8_t, N * sizeof(U)>>(words);
  constexpr size_t zero_byte = sizeof...(I) - 1;  // beyond the N bytes of `word`
  out = reinterpret_cast<Vec<U, N>>(
      __builtin_shufflevector(bytes, bytes, (I % sizeof(U) == 0 ? I / sizeof(U) : zero_byte)...));
}

template <typename V, size_t... I>
inline void deinterleave(const V& low, const V& high, V& evens, V& odds, std::index_sequence<I...>) {
  evens = __builtin_shufflevector(low, high, (2 * I)...);
  odds = __builtin_shufflevector(low, high, (2 * I + 1)...);
}

template <typename V, size_t... I>
inline void interleave(const V& evens, const V& odds, V& low, V& high, std::index_sequence<I...>) {
  constexpr size_t n = sizeof...(I);
  low = __builtin_shufflevector(evens, odds, (I / 2 + (I % 2) * n)...);
  high = __builtin_shufflevector(evens, odds, (n / 2 + I / 2 + (I % 2) * n)...);
}

// One window row of a block as one vector per window column, widened to Compute<T>: lane j,
// column c is row[j*lane_step + c*col_step]. A lane step of 2 only occurs for NCHW with kernel 2,
// where col_step is 1 and lanes and columns interleave in memory.
template <typename T, int64_t N, typename Kernel, typename LaneStep, typename Lanes>
inline void load_window_row(const T* row, Kernel kernel, LaneStep lane_step, int64_t col_step, Lanes lanes,
                            Vec<Compute<T>, N>* columns) {
  if constexpr (is_full<Lanes> && std::is_same_v<LaneStep, Fixed<2>> && std::is_same_v<T, uint16_t>) {
    // Each 32-bit word holds one lane's two bf16 columns; each is a float's top half.
    Vec<uint32_t, N> pairs;
    std::memcpy(&pairs, row, sizeof pairs);
    columns[0] = reinterpret_cast<Vec<float, N>>(pairs << 16);
    columns[1] = reinterpret_cast<Vec<float, N>>(pairs & 0xFFFF0000u);
  } else if constexpr (is_full<Lanes> && std::is_same_v<LaneStep, Fixed<2>>) {
    Vec<T, N> low, high;
    std::memcpy(&low, row, sizeof low);
    std::memcpy(&high, row + N, sizeof high);
    deinterleave(low, high, columns[0], columns[1], std::make_index_sequence<N>{});
  } else {
    for (int64_t c = 0; c < kernel; ++c) {
      Vec<T, N> column;
      if constexpr (is_full<Lanes> && std::is_same_v<LaneStep, Fixed<1>>) {
        std::memcpy(&column, row + c * col_step, sizeof column);
      } else {
        std::array<T, N> gathered;
        for (int64_t j = 0; j < N; ++j) gathered[j] = row[std::min<int64_t>(j, lanes - 1) * lane_step + c * col_step];
        std::memcpy(&column, gathered.data(), sizeof column);
      }
      widen<T, N>(column, columns[c]);
    }
  }
}

// The inverse of load_window_row, writing only the block's lanes.
template <typename T, int64_t N, typename Kernel, typename LaneStep, typename Lanes>
inline void store_window_row(T* row, Kernel kernel, LaneStep lane_step, int64_t col_step, Lanes lanes,
                             const Vec<T, N>* columns) {
  if constexpr (is_full<Lanes> && std::is_same_v<LaneStep, Fixed<1>>) {
    for (int64_t c = 0; c < kernel; ++c) std::memcpy(row + c * col_step, &columns[c], sizeof columns[c]);
  } else if constexpr (is_full<Lanes> && std::is_same_v<LaneStep, Fixed<2>>) {
    Vec<T, N> low, high;
    interleave(columns[0], columns[1], low, high, std::make_index_sequence<N>{});
    std::memcpy(row, &low, sizeof low);
    std::memcpy(row + N, &high, sizeof high);
  } else {
    for (int64_t c = 0; c < kernel; ++c) {
      for (int64_t j = 0; j < lanes; ++j) row[j * lane_step + c * col_step] = columns[c][j];
    }
  }
}

// A 4-D batch as the kernels walk it: `images` of [height][width][depth] values, one after
// another. NCHW is N*C images of depth 1, channels_last N images of depth C, and oneDNN's
// channel-blocked layouts N*C/b images of depth b (see OnednnImages).
struct ImageGrid {
  int64_t images, height, width, depth;
};

ImageGrid grid_of(at::IntArrayRef sizes, bool channels_last) {
  if (channels_last) return {sizes[0], sizes[2], sizes[3], sizes[1]};
  return {sizes[0] * sizes[1], sizes[2], sizes[3], 1};
}

// The problem cut into bands: a band is one output row and the `kernel` input rows under it.
// Depth 1 (NCHW) pools each plane with one element per spatial position; depth d > 1 pools each
// image with d elements per position. Inside a band, a vector lane is one window: at depth 1
// lanes run along the output row (input stride kernel), else along the d elements of one output
// position (input stride 1), one group of lanes per output column.
struct Bands {
  Bands(const ImageGrid& grid, int64_t kernel_size)
      : kernel(kernel_size),
        images(grid.images),
        height(grid.height),
        depth(grid.depth),
        out_height(grid.height / kernel_size),
        out_width(grid.width / kernel_size),
        row_step(grid.width * grid.depth) {}

  int64_t count() const { return images * out_height; }
  int64_t groups() const { return depth == 1 ? 1 : out_width; }
  int64_t lanes() const { return depth == 1 ? out_width : depth; }
  int64_t input_offset(int64_t band) const {
    return ((band / out_height) * height + (band % out_height) * kernel) * row_step;
  }
  int64_t output_offset(int64_t band) const { return band * out_width * depth; }
  int64_t group_input_offset(int64_t group) const { return group * kernel * depth; }
  int64_t group_output_offset(int64_t group) const { return group * depth; }
  // Bands per parallel chunk, so that a chunk reads about kGrainElements inputs.
  int64_t grain() const { return std::max<int64_t>(1, kGrainElements / (kernel * row_step)); }

  int64_t kernel, images, height, depth, out_height, out_width, row_step;
};

// Calls block(first_lane, Fixed<N>) over lanes [0, count). The last block ends at `count` and may
// overlap the one before it, recomputing (and rewriting with the same values) a few lanes rather
// than running a scalar tail.
template <int64_t N, typename Block>
inline void cover_with_blocks(int64_t count, const Block& block) {
  for (int64_t first = 0; first + N <= count; first += N) block(first, Fixed<N>{});
  if (count % N != 0) block(count - N, Fixed<N>{});
}

template <typename Block>
inline void for_each_block(int64_t count, const Block& block) {
  if (count >= kWideBlock) {
    cover_with_blocks<kWideBlock>(count, block);
  } else if (count >= kNarrowBlock) {
    cover_with_blocks<kNarrowBlock>(count, block);
  } else {
    block(0, count);
  }
}

// Forward of one block of windows; lane j's window element (r, c) is in[j*lane_step + r*row_step + c*col_step]:
//   best   = torch's max_pool2d scan: from -inf, row-major, take x if x > best or x is NaN
//            (the first maximum wins; a NaN wins over numbers, the last NaN over other NaNs)
//   out    = best if best > 0 or NaN, else 0                         (relu(max_pool2d(x)))
//   winner = best's position r*kernel + c, or kNoWinner where out is 0
template <typename T, typename Kernel, typename LaneStep, typename Lanes>
inline void pool_windows(const T* in, Kernel kernel, LaneStep lane_step, int64_t row_step, int64_t col_step,
                         Lanes lanes, T* out, uint8_t* winners) {
  constexpr int64_t N = vector_width<Lanes>;
  using Values = Vec<Compute<T>, N>;
  using Masks = Vec<Mask<T>, N>;
  Values best = Values{} - std::numeric_limits<Compute<T>>::infinity();
  Masks winner = {};
  std::array<Values, max_kernel<Kernel>> columns;
  for (int64_t r = 0; r < kernel; ++r) {
    load_window_row<T, N>(in + r * row_step, kernel, lane_step, col_step, lanes, columns.data());
    for (int64_t c = 0; c < kernel; ++c) {
      const Values& candidate = columns[c];
      const Masks take = (candidate > best) | (candidate != candidate);
      best = take ? candidate : best;
      winner = take ? Masks{} + static_cast<Mask<T>>(r * kernel + c) : winner;
    }
  }
  const Masks zeroed = best <= 0;
  Vec<T, N> value;
  narrow<T, N>(zeroed ? Values{} : best, value);
  store_contiguous<T, N>(out, lanes, value);
  if (winners == nullptr) return;
  Vec<uint8_t, N> record;
  low_bytes<Mask<T>, N>(zeroed ? Masks{} + kNoWinner : winner, record, std::make_index_sequence<N>{});
  store_contiguous<uint8_t, N>(winners, lanes, record);
}

// Backward of one block of windows laid out as in pool_windows, writing each window element once:
//   grad_in[position p] = grad_out if winner == p else 0            (kNoWinner matches no p)
template <typename B, typename Kernel, typename LaneStep, typename Lanes>
inline void unpool_windows(const B* grad_out, const uint8_t* winners, Kernel kernel, LaneStep lane_step,
                           int64_t row_step, int64_t col_step, Lanes lanes, B* grad_in) {
  constexpr int64_t N = vector_width<Lanes>;
  using Values = Vec<B, N>;
  Values grad;
  load_contiguous<B, N>(grad_out, lanes, grad);
  Vec<uint8_t, N> record;
  load_contiguous<uint8_t, N>(winners, lanes, record);
  Values winner;
  zero_extend_bytes<B, N>(record, winner, std::make_index_sequence<N * sizeof(B)>{});
  std::array<Values, max_kernel<Kernel>> columns;
  for (int64_t r = 0; r < kernel; ++r) {
    for (int64_t c = 0; c < kernel; ++c) {
      columns[c] = winner == Values{} + static_cast<B>(r * kernel + c) ? grad : Values{};
    }
    store_window_row<B, N>(grad_in + r * row_step, kernel, lane_step, col_step, lanes, columns.data());
  }
}

// Floor mode leaves the last width % kernel columns of each band, and the last height % kernel
// rows of each image, outside every window: their gradient is 0.
template <typename T>
void zero_uncovered(const Bands& bands, int64_t band, T* band_grad_in) {
  const int64_t covered = bands.out_width * bands.kernel * bands.depth;
  for (int64_t r = 0; r < bands.kernel; ++r) {
    std::fill(band_grad_in + r * bands.row_step + covered, band_grad_in + (r + 1) * bands.row_step, T(0));
  }
  if (band % bands.out_height == bands.out_height - 1) {
    T* below = band_grad_in + bands.kernel * bands.row_step;
    std::fill(below, below + (bands.height - bands.out_height * bands.kernel) * bands.row_step, T(0));
  }
}

// Forward of bands [begin, end); see pool_windows. Cloned per instruction set and picked at run
// time (x86-64-v4 rather than plain avx512f for AVX-512 VL/BW: byte and 16-bit lanes in 256-bit
// registers); flatten inlines the block kernels so that each clone compiles them for its own set.
template <typename T, typename Kernel, typename LaneStep>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))
void pool_bands(const Bands& bands, Kernel kernel, LaneStep lane_step, const T* in, T* out,
                uint8_t* winners, int64_t begin, int64_t end) {
  for (int64_t band = begin; band < end; ++band) {
    for (int64_t group = 0; group < bands.groups(); ++group) {
      const T* group_in = in + bands.input_offset(band) + bands.group_input_offset(group);
      const int64_t group_out = bands.output_offset(band) + bands.group_output_offset(group);
      for_each_block(bands.lanes(), [&](int64_t first, auto lanes) {
        pool_windows(group_in + first * lane_step, kernel, lane_step, bands.row_step, bands.depth,
                     lanes, out + group_out + first,
                     winners == nullptr ? nullptr : winners + group_out + first);
      });
    }
  }
}

// Backward of bands [begin, end); see unpool_windows and zero_uncovered.
template <typename T, typename Kernel, typename LaneStep>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))
void unpool_bands(const Bands& bands, Kernel kernel, LaneStep lane_step, const T* grad_out,
                  const uint8_t* winners, T* grad_in, int64_t begin, int64_t end) {
  for (int64_t band = begin; band < end; ++band) {
    T* band_grad_in = grad_in + bands.input_offset(band);
    for (int64_t group = 0; group < bands.groups(); ++group) {
      T* group_grad_in = band_grad_in + bands.group_input_offset(group);
      const int64_t group_out = bands.output_offset(band) + bands.group_output_offset(group);
      for_each_block(bands.lanes(), [&](int64_t first, auto lanes) {
        unpool_windows(grad_out + group_out + first, winners + group_out + first, kernel, lane_step,
                       bands.row_step, bands.depth, lanes, group_grad_in + first * lane_step);
      });
    }
    zero_uncovered(bands, band, band_grad_in);
  }
}

// Overlapping or padded windows (stride != kernel, padding: ResNet's 3x3 stride-2 stem pool),
// forward only: inference needs no winner record, and training keeps torch's composition, whose
// backward adds up the gradients of overlapping windows. An input row feeds several output rows,
// so each output row pools in two passes at depth 1 (NCHW; deeper images scan each window, see
// pool_overlapping_deep):
//   columns[p + w] = max over the window's rows of x[row][w], from 0 (ReLU), taking NaN
//   out[o]         = max over c < kernel of columns[o*stride + c]
// where the `p = padding` columns on either side stay 0. Torch pads with -inf after the ReLU; max
// with 0 gives the same wherever a window holds an input element, which torch's padding <=
// kernel / 2 guarantees. A window holding several NaNs may return another of them than torch.
struct OverlappingWindows {
  OverlappingWindows(const ImageGrid& grid, const ReluMaxPool2dOptions& options)
      : kernel(options.kernel_size()),
        stride(options.stride()),
        padding(options.padding()),
        images(grid.images),
        depth(grid.depth),
        height(grid.height),
        width(grid.width),
        out_height(pooled_size(height, options)),
        out_width(pooled_size(width, options)) {}

  // torch's pooling output size for dilation 1.
  static int64_t pooled_size(int64_t size, const ReluMaxPool2dOptions& o) {
    const int64_t span = size + 2 * o.padding() - o.kernel_size() + (o.ceil_mode() ? o.stride() - 1 : 0);
    int64_t pooled = span / o.stride() + 1;
    // ceil_mode's last window must start inside the input or its left padding.
    if (o.ceil_mode() && (pooled - 1) * o.stride() >= size + o.padding()) --pooled;
    return pooled;
  }

  int64_t count() const { return images * out_height; }
  // The input rows [first_input, last_input) under output row `out_index`; likewise columns.
  int64_t first_input(int64_t out_index) const { return std::max<int64_t>(0, out_index * stride - padding); }
  int64_t last_input(int64_t out_index, int64_t size) const {
    return std::min<int64_t>(size, out_index * stride - padding + kernel);
  }
  // Depth 1: the zero-padded row of column maxima, with room for the last block's strided loads.
  int64_t columns_size() const { return std::max(padding + width, stride * out_width + kernel) + 2 * kWideBlock; }
  int64_t grain() const { return std::max<int64_t>(1, kGrainElements / (kernel * width * depth)); }

  int64_t kernel, stride, padding, images, depth, height, width, out_height, out_width;
};

// best = candidate where candidate > best or is NaN (torch's max_pool2d scan), for vectors and scalars.
template <typename V>
inline void keep_max(V& best, const V& candidate) {
  const auto take = (candidate > best) | (candidate != candidate);
  best = take ? candidate : best;
}

// widen and narrow of one value.
template <typename T>
inline Compute<T> widen_one(T value) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    const uint32_t bits = static_cast<uint32_t>(value) << 16;
    float widened;
    std::memcpy(&widened, &bits, sizeof widened);
    return widened;
  } else {
    return value;
  }
}

template <typename T>
inline T narrow_one(Compute<T> value) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return static_cast<uint16_t>(bits >> 16);
  } else {
    return value;
  }
}

// Lane j of v = from[j * stride].
template <int64_t N, typename C>
inline void load_every(const C* from, int64_t stride, Vec<C, N>& v) {
  if (stride == 1) {
    std::memcpy(&v, from, sizeof v);
  } else if (stride == 2) {
    Vec<C, N> low, high, odds;
    std::memcpy(&low, from, sizeof low);
    std::memcpy(&high, from + N, sizeof high);
    deinterleave(low, high, v, odds, std::make_index_sequence<N>{});
  } else {
    for (int64_t j = 0; j < N; ++j) v[j] = from[j * stride];
  }
}

// Output rows [begin, end) at depth 1 (NCHW): one plane's output row each.
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))
void pool_overlapping_planes(const OverlappingWindows& windows, const T* in, T* out, int64_t begin, int64_t end) {
  using C = Compute<T>;
  constexpr int64_t N = kWideBlock;
  const int64_t width = windows.width;
  std::vector<C> columns(windows.columns_size(), C(0));
  C* row_max = columns.data() + windows.padding;
  for (int64_t band = begin; band < end; ++band) {
    const int64_t out_row = band % windows.out_height;
    const T* plane = in + (band / windows.out_height) * windows.height * width;
    const T* first_row = plane + windows.first_input(out_row) * width;
    const T* last_row = plane + windows.last_input(out_row, windows.height) * width;
    int64_t w = 0;
    for (; w + N <= width; w += N) {
      Vec<C, N> best = {};
      for (const T* row = first_row; row != last_row; row += width) {
        Vec<T, N> stored;
        Vec<C, N> candidate;
        std::memcpy(&stored, row + w, sizeof stored);
        widen<T, N>(stored, candidate);
        keep_max(best, candidate);
      }
      std::memcpy(row_max + w, &best, sizeof best);
    }
    for (; w < width; ++w) {
      C best = 0;
      for (const T* row = first_row; row != last_row; row += width) keep_max(best, widen_one(row[w]));
      row_max[w] = best;
    }
    T* out_row_data = out + band * windows.out_width;
    int64_t o = 0;
    for (; o + N <= windows.out_width; o += N) {
      Vec<C, N> best = {};
      for (int64_t c = 0; c < windows.kernel; ++c) {
        Vec<C, N> candidate;
        load_every<N>(columns.data() + o * windows.stride + c, windows.stride, candidate);
        keep_max(best, candidate);
      }
      Vec<T, N> value;
      narrow<T, N>(best, value);
      std::memcpy(out_row_data + o, &value, sizeof value);
    }
    for (; o < windows.out_width; ++o) {
      C best = 0;
      for (int64_t c = 0; c < windows.kernel; ++c) keep_max(best, columns[o * windows.stride + c]);
      out_row_data[o] = narrow_one<T>(best);
    }
  }
}

// Output rows [begin, end) at depth > 1 (channels_last, oneDNN's blocks): one image's output row
// each, vector lanes along the depth, in two passes as at depth 1 (a window's 9 loads become 3 + 3
// per output: ResNet's stem pool ran at a third of the memory's speed scanning each window):
//   columns[w] = max over the window's rows of x[row][w], from 0 (ReLU), taking NaN
//   out[o]     = max over the window's columns c of columns[c]
template <typename T>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))
void pool_overlapping_deep(const OverlappingWindows& windows, const T* in, T* out, int64_t begin,
                                    int64_t end) {
  using C = Compute<T>;
  const int64_t depth = windows.depth, width = windows.width;
  std::vector<C> columns(width * depth);
  for (int64_t band = begin; band < end; ++band) {
    const int64_t out_row = band % windows.out_height;
    const T* image = in + (band / windows.out_height) * windows.height * width * depth;
    const int64_t first_row = windows.first_input(out_row), last_row = windows.last_input(out_row, windows.height);
    // Row by row, each a sequential sweep (interleaving the window's rows left the loads waiting on
    // memory), into the columns' maxima, which stay in the L1 cache.
    std::fill(columns.begin(), columns.end(), C(0));
    for (int64_t r = first_row; r < last_row; ++r) {
      const T* row = image + r * width * depth;
      for (int64_t w = 0; w < width; ++w) {
        for_each_block(depth, [&](int64_t first, auto lanes) {
          constexpr int64_t N = vector_width<decltype(lanes)>;
          Vec<T, N> stored;
          Vec<C, N> candidate, best;
          load_contiguous<T, N>(row + w * depth + first, lanes, stored);
          widen<T, N>(stored, candidate);
          load_contiguous<C, N>(columns.data() + w * depth + first, lanes, best);
          keep_max(best, candidate);
          store_contiguous<C, N>(columns.data() + w * depth + first, lanes, best);
        });
      }
    }
    for (int64_t o = 0; o < windows.out_width; ++o) {
      const int64_t first_column = windows.first_input(o), last_column = windows.last_input(o, width);
      T* position = out + (band * windows.out_width + o) * depth;
      for_each_block(depth, [&](int64_t first, auto lanes) {
        constexpr int64_t N = vector_width<decltype(lanes)>;
        Vec<C, N> best = {};
        for (int64_t c = first_column; c < last_column; ++c) {
          Vec<C, N> candidate;
          load_contiguous<C, N>(columns.data() + c * depth + first, lanes, candidate);
          keep_max(best, candidate);
        }
        Vec<T, N> value;
        narrow<T, N>(best, value);
        store_contiguous<T, N>(position + first, lanes, value);
      });
    }
  }
}

// Calls fn(kernel, lane_step) with compile-time values for the common shapes, so their window
// loops unroll and their lane loads have a constant stride.
template <typename Fn>
void with_static_shape(const Bands& bands, const Fn& fn) {
  auto with_lane_step = [&](auto kernel) {
    if (bands.depth == 1) {
      fn(kernel, kernel);
    } else {
      fn(kernel, Fixed<1>{});
    }
  };
  switch (bands.kernel) {
    case 2:
      with_lane_step(Fixed<2>{});
      break;
    case 3:
      with_lane_step(Fixed<3>{});
      break;
    default:
      with_lane_step(bands.kernel);
  }
}

template <typename As, typename scalar_t>
As* data_as(const torch::Tensor& t) {
  return reinterpret_cast<As*>(t.data_ptr<scalar_t>());
}

bool is_channels_last(const torch::Tensor& x) {
  return x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
}

at::MemoryFormat memory_format(bool channels_last) {
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// Whether the windows tile the input (kernel == stride, no padding): the band kernels, which
// also record winners for the backward.
bool windows_tile(int64_t height, int64_t width, const ReluMaxPool2dOptions& options) {
  const int64_t k = options.kernel_size();
  // ceil_mode adds a partial window only where a size is not a multiple of the kernel.
  const bool partial_windows = options.ceil_mode() && (height % k != 0 || width % k != 0);
  return options.stride() == k && k <= kMaxFastKernel && options.padding() == 0 && options.dilation() == 1 &&
         height >= k && width >= k && !partial_windows;
}

// Options torch accepts (others go to torch for its error), at least one window per row and column.
bool windows_overlap_supported(int64_t height, int64_t width, const ReluMaxPool2dOptions& options) {
  const int64_t k = options.kernel_size(), p = options.padding();
  return options.dilation() == 1 && p <= k / 2 && height + 2 * p >= k && width + 2 * p >= k;
}

std::vector<int64_t> output_sizes(at::IntArrayRef input_sizes, const ReluMaxPool2dOptions& options) {
  return {input_sizes[0], input_sizes[1], OverlappingWindows::pooled_size(input_sizes[2], options),
          OverlappingWindows::pooled_size(input_sizes[3], options)};
}

// relu then max pooling of `grid` from `in` into `out`, with the winner record where `winners`
// is given (tiling windows only).
void pool_grid(const ImageGrid& grid, const ReluMaxPool2dOptions& options, at::ScalarType dtype, const void* in,
               void* out, uint8_t* winners) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "relu_max_pool2d", [&] {
    using T = Storage<scalar_t>;
    const auto* from = static_cast<const T*>(in);
    auto* to = static_cast<T*>(out);
    if (windows_tile(grid.height, grid.width, options)) {
      const Bands bands(grid, options.kernel_size());
      with_static_shape(bands, [&](auto k, auto lane_step) {
        at::parallel_for(0, bands.count(), bands.grain(), [&](int64_t begin, int64_t end) {
          pool_bands(bands, k, lane_step, from, to, winners, begin, end);
        });
      });
      return;
    }
    const OverlappingWindows windows(grid, options);
    at::parallel_for(0, windows.count(), windows.grain(), [&](int64_t begin, int64_t end) {
      if (grid.depth == 1) {
        pool_overlapping_planes(windows, from, to, begin, end);
      } else {
        pool_overlapping_deep(windows, from, to, begin, end);
      }
    });
  });
}

// The output of a dense tensor, and with record_winners the winner record.
std::pair<torch::Tensor, torch::Tensor> dense_forward(const torch::Tensor& x, const ReluMaxPool2dOptions& options,
                                                      bool record_winners) {
  const bool channels_last = is_channels_last(x);
  const auto sizes = output_sizes(x.sizes(), options);
  const auto format = memory_format(channels_last);
  auto out = torch::empty(sizes, x.options().memory_format(format));
  torch::Tensor winners;
  if (record_winners) winners = torch::empty(sizes, x.options().dtype(torch::kUInt8).memory_format(format));
  pool_grid(grid_of(x.sizes(), channels_last), options, x.scalar_type(), x.data_ptr(), out.data_ptr(),
            record_winners ? winners.data_ptr<uint8_t>() : nullptr);
  return {out, winners};
}

// torch's composition, the reference every path matches.
torch::Tensor unfused(const torch::Tensor& x, const ReluMaxPool2dOptions& options) {
  return torch::max_pool2d(torch::relu(x), options.kernel_size(), options.stride(), options.padding(),
                           options.dilation(), options.ceil_mode());
}

// A oneDNN tensor (an optimized inference graph's) pooled in its own layout, without converting
// to dense and back; other oneDNN layouts, and calls that record a gradient, go through dense.
torch::Tensor onednn_forward(const torch::Tensor& x, const ReluMaxPool2dOptions& options, bool records_gradient) {
  const auto images = onednn_images(x);
  const bool supported = windows_tile(x.size(2), x.size(3), options) ||
                         windows_overlap_supported(x.size(2), x.size(3), options);
  if (!images || records_gradient || !supported) return relu_max_pool2d(x.to_dense(), options).to_mkldnn();
  auto out = empty_onednn_images(x, output_sizes(x.sizes(), options));
  pool_grid({images->images, images->height, images->width, images->depth}, options, images->dtype, images->data,
            onednn_images(out)->data, nullptr);
  return out;
}

torch::Tensor fused_backward(const torch::Tensor& grad_out, const torch::Tensor& winners,
                             at::IntArrayRef input_sizes, int64_t kernel, bool channels_last) {
  const Bands bands(grid_of(input_sizes, channels_last), kernel);
  const auto format = memory_format(channels_last);
  const auto grad = grad_out.contiguous(format);
  auto grad_in = torch::empty(input_sizes, grad.options().memory_format(format));
  const uint8_t* winner_data = winners.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, grad.scalar_type(), "relu_max_pool2d_backward", [&] {
    const auto* grad_data = data_as<Bits<scalar_t>, scalar_t>(grad);
    auto* grad_in_data = data_as<Bits<scalar_t>, scalar_t>(grad_in);
    with_static_shape(bands, [&](auto k, auto lane_step) {
      at::parallel_for(0, bands.count(), bands.grain(), [&](int64_t begin, int64_t end) {
        unpool_bands(bands, k, lane_step, grad_data, winner_data, grad_in_data, begin, end);
      });
    });
  });
  return grad_in;
}

// Saves only the one-byte winner record: each window's gradient goes to its winner, if any.
struct ReluMaxPoolFunction : public torch::autograd::Function<ReluMaxPoolFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, int64_t kernel) {
    auto [out, winners] = dense_forward(x, kernel, /*record_winners=*/true);
    ctx->save_for_backward({winners});
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["input_sizes"] = x.sizes().vec();
    ctx->saved_data["channels_last"] = is_channels_last(x);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // Grad mode is on in a backward only under create_graph: the kernel's result would silently
    // drop out of the higher-order graph.
    if (torch::GradMode::is_enabled()) {
      throw UsageError("create_graph", "relu_max_pool2d's backward is not differentiable (no double backward)");
    }
    auto grad_in = fused_backward(grad_outputs[0], ctx->get_saved_variables()[0],
                                  ctx->saved_data["input_sizes"].toIntVector(),
                                  ctx->saved_data["kernel"].toInt(),
                                  ctx->saved_data["channels_last"].toBool());
    return {grad_in, torch::Tensor()};
  }
};

bool is_fast_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble;
}

bool is_dense_image(const torch::Tensor& x) {
  return x.dim() == 4 && x.device().is_cpu() && x.layout() == torch::kStrided && is_fast_dtype(x.scalar_type()) &&
         x.is_contiguous(x.suggest_memory_format());
}

void require_at_least(const std::string& field, int64_t value, int64_t minimum) {
  if (value < minimum) {
    throw UsageError(field, "must be at least " + std::to_string(minimum) + ", got " + std::to_string(value));
  }
}

}  // namespace

void validate(const ReluMaxPool2dOptions& options) {
  require_at_least("kernel_size", options.kernel_size(), 1);
  require_at_least("stride", options.stride(), 1);
  require_at_least("padding", options.padding(), 0);
  require_at_least("dilation", options.dilation(), 1);
}

torch::Tensor relu_max_pool2d(const torch::Tensor& x, const ReluMaxPool2dOptions& options) {
  validate(options);
  const bool records_gradient = torch::GradMode::is_enabled() && x.requires_grad();
  if (x.is_mkldnn() && x.dim() == 4) return onednn_forward(x, options, records_gradient);
  if (is_dense_image(x) && windows_tile(x.size(2), x.size(3), options)) {
    if (records_gradient) return ReluMaxPoolFunction::apply(x, options.kernel_size())[0];
    return dense_forward(x, options, /*record_winners=*/false).first;
  }
  if (is_dense_image(x) && !records_gradient && windows_overlap_supported(x.size(2), x.size(3), options)) {
    return dense_forward(x, options, /*record_winners=*/false).first;
  }
  return unfused(x, options);
}

torch::Tensor relu_max_pool2d(const torch::Tensor& x, int64_t kernel, int64_t stride) {
  return relu_max_pool2d(x, ReluMaxPool2dOptions(kernel).stride(stride));
}

ReluMaxPool2dImpl::ReluMaxPool2dImpl(const ReluMaxPool2dOptions& options_) : options(options_) {
  validate(options);
}

void ReluMaxPool2dImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "afterburner::kernels::ReluMaxPool2d(kernel_size=" << options.kernel_size()
         << ", stride=" << options.stride() << ", padding=" << options.padding()
         << ", dilation=" << options.dilation() << ", ceil_mode=" << options.ceil_mode() << ")";
}

torch::Tensor ReluMaxPool2dImpl::forward(const torch::Tensor& x) { return relu_max_pool2d(x, options); }

}  // namespace afterburner::kernels
