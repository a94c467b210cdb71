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

// The problem cut into bands: a band is one output row and the `kernel` input rows under it.
// NCHW pools each (n, c) plane with one element per spatial position (depth 1); channels_last
// pools each image with C elements per position (depth C). Inside a band, a vector lane is one
// window: NCHW lanes run along the output row (input stride kernel), channels_last lanes along
// the channels of one output position (input stride 1), one group of lanes per output column.
struct Bands {
  Bands(at::IntArrayRef input_sizes, int64_t kernel_size, bool channels_last)
      : kernel(kernel_size),
        images(channels_last ? input_sizes[0] : input_sizes[0] * input_sizes[1]),
        height(input_sizes[2]),
        depth(channels_last ? input_sizes[1] : 1),
        out_height(input_sizes[2] / kernel_size),
        out_width(input_sizes[3] / kernel_size),
        row_step(input_sizes[3] * depth) {}

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

// The output, and with record_winners the winner record, of the fast path.
std::pair<torch::Tensor, torch::Tensor> fused_forward(const torch::Tensor& x, int64_t kernel,
                                                      bool record_winners) {
  const bool channels_last = is_channels_last(x);
  const Bands bands(x.sizes(), kernel, channels_last);
  const std::vector<int64_t> out_sizes{x.size(0), x.size(1), bands.out_height, bands.out_width};
  const auto format = memory_format(channels_last);
  auto out = torch::empty(out_sizes, x.options().memory_format(format));
  torch::Tensor winners;
  if (record_winners) winners = torch::empty(out_sizes, x.options().dtype(torch::kUInt8).memory_format(format));
  uint8_t* winner_data = record_winners ? winners.data_ptr<uint8_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "relu_max_pool2d", [&] {
    const auto* in = data_as<Storage<scalar_t>, scalar_t>(x);
    auto* out_data = data_as<Storage<scalar_t>, scalar_t>(out);
    with_static_shape(bands, [&](auto k, auto lane_step) {
      at::parallel_for(0, bands.count(), bands.grain(), [&](int64_t begin, int64_t end) {
        pool_bands(bands, k, lane_step, in, out_data, winner_data, begin, end);
      });
    });
  });
  return {out, winners};
}

torch::Tensor fused_backward(const torch::Tensor& grad_out, const torch::Tensor& winners,
                             at::IntArrayRef input_sizes, int64_t kernel, bool channels_last) {
  const Bands bands(input_sizes, kernel, channels_last);
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
    auto [out, winners] = fused_forward(x, kernel, /*record_winners=*/true);
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

// ceil_mode adds a partial window only where the size is not a multiple of the kernel.
bool ceil_mode_adds_windows(const torch::Tensor& x, const ReluMaxPool2dOptions& options) {
  const int64_t k = options.kernel_size();
  return options.ceil_mode() && (x.size(2) % k != 0 || x.size(3) % k != 0);
}

bool fast_path_applies(const torch::Tensor& x, const ReluMaxPool2dOptions& options) {
  const int64_t k = options.kernel_size();
  return x.dim() == 4 && x.device().is_cpu() && x.layout() == torch::kStrided &&
         is_fast_dtype(x.scalar_type()) && x.is_contiguous(x.suggest_memory_format()) &&
         options.stride() == k && k <= kMaxFastKernel && options.padding() == 0 &&
         options.dilation() == 1 && x.size(2) >= k && x.size(3) >= k &&
         !ceil_mode_adds_windows(x, options);
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
  if (!fast_path_applies(x, options)) {
    return torch::max_pool2d(torch::relu(x), options.kernel_size(), options.stride(),
                             options.padding(), options.dilation(), options.ceil_mode());
  }
  if (torch::GradMode::is_enabled() && x.requires_grad()) {
    return ReluMaxPoolFunction::apply(x, options.kernel_size())[0];
  }
  return fused_forward(x, options.kernel_size(), /*record_winners=*/false).first;
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
