// 16 fp32 lanes as GCC vector extensions, for the kernels that keep their sums in registers
// (conv2d's depthwise weight gradient, short_attention's rows of scores) or compute lane by lane
// (gelu's gradient, layer_norm's rows). Internal to src/kernels.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace afterburner::kernels::simd {

// 16 fp32 lanes (one AVX-512 register; two AVX2 ones in the avx2 clone). The helpers taking and
// returning them are always inlined into the kernels, each compiled per instruction set, so the
// ABI of a vector passed by value between functions (GCC's -Wpsabi note, off) never applies.
using Vec = float __attribute__((vector_size(64)));
using Bits = uint32_t __attribute__((vector_size(64)));
using Halves = uint16_t __attribute__((vector_size(32)));
constexpr int64_t kLanes = 16;

__attribute__((always_inline)) inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// bf16 is the upper half of an fp32: widening is a shift.
__attribute__((always_inline)) inline Vec load(const c10::BFloat16* p) {
  Halves h;
  std::memcpy(&h, p, sizeof h);
  const Bits bits = __builtin_convertvector(h, Bits) << 16;
  Vec v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// The first `lanes` (< kLanes) values at p, the other lanes 0: the last block of a row whose length
// is not a multiple of kLanes, read without reaching past the tensor's end.
template <typename T>
__attribute__((always_inline)) inline Vec load_partial(const T* p, int64_t lanes) {
  T values[kLanes] = {};
  std::memcpy(values, p, lanes * sizeof(T));
  return load(values);
}

// A whole vector at p where `full`, else its first `lanes` values.
template <bool full, typename T>
__attribute__((always_inline)) inline Vec load(const T* p, int64_t lanes) {
  return full ? load(p) : load_partial(p, lanes);
}

// The first `lanes` (<= kLanes) values at p: a whole vector's load where they are kLanes.
template <typename T>
__attribute__((always_inline)) inline Vec load_upto(const T* p, int64_t lanes) {
  return lanes == kLanes ? load(p) : load_partial(p, lanes);
}

__attribute__((always_inline)) inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// 32-bit integers, signed and unsigned, as many as a GCC vector of floats V has lanes.
template <typename V>
struct IntsOf {
  typedef int32_t type __attribute__((vector_size(sizeof(V))));
};
template <typename V>
struct UintsOf {
  typedef uint32_t type __attribute__((vector_size(sizeof(V))));
};

// Each lane's bf16 bits (in the low half), rounded to nearest even, NaN a quiet NaN: as
// c10::BFloat16's constructor rounds one value.
template <typename V>
__attribute__((always_inline)) inline typename UintsOf<V>::type bf16_bits(V v) {
  using Bits = typename UintsOf<V>::type;
  Bits bits;
  std::memcpy(&bits, &v, sizeof bits);
  const Bits rounded = (bits + (((bits >> 16) & 1u) + 0x7fffu)) >> 16;
  return v != v ? Bits{} + 0x7fc0u : rounded;
}

__attribute__((always_inline)) inline void store(c10::BFloat16* p, Vec v) {
  const Halves halves = __builtin_convertvector(bf16_bits(v), Halves);
  std::memcpy(p, &halves, sizeof halves);
}

// The first `lanes` (< kLanes) values of v at p, nothing past them.
template <typename T>
__attribute__((always_inline)) inline void store_partial(T* p, Vec v, int64_t lanes) {
  T values[kLanes];
  store(values, v);
  std::memcpy(p, values, lanes * sizeof(T));
}

// The first `lanes` (<= kLanes) values of v at p: a whole vector's store where they are kLanes.
template <typename T>
__attribute__((always_inline)) inline void store_upto(T* p, Vec v, int64_t lanes) {
  if (lanes == kLanes) {
    store(p, v);
  } else {
    store_partial(p, v, lanes);
  }
}

// exp_nonpositive (exp_nonpositive.h) on every lane of a GCC vector of floats V: the same steps,
// as vector operations.
template <typename V>
__attribute__((always_inline)) inline V exp_nonpositive(V v) {
  using Ints = typename IntsOf<V>::type;
  const V x = v >= -87.3f ? v : V{} - 87.3f;
  const V n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const V r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  V p = V{} + 1.0f / 5040;
  for (const float coefficient : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = p * r + coefficient;
  const Ints exponent_bits = (__builtin_convertvector(n, Ints) + 127) << 23;
  V two_to_n;
  std::memcpy(&two_to_n, &exponent_bits, sizeof two_to_n);
  return v >= -87.3f ? p * two_to_n : (v != v ? v : V{});
}

// exp(-|s|), which cannot overflow.
__attribute__((always_inline)) inline Vec exp_of_minus_magnitude(Vec s) { return exp_nonpositive(s < 0.0f ? s : -s); }

// 1 / (1 + exp(-s)) from t = exp(-|s|): 1 / (1 + t) for s >= 0 and t / (1 + t) below (numerator
// and denominator times exp(s)). NaN stays NaN; -inf gives 0.
__attribute__((always_inline)) inline Vec sigmoid_of(Vec s, Vec t) { return (s < 0.0f ? t : Vec{} + 1.0f) / (1.0f + t); }

// silu(s) = s / (1 + exp(-s)), for s < 0 written s t / (1 + t) (t = exp(-|s|)): NaN stays NaN,
// -inf gives NaN and +inf +inf, as ATen's.
__attribute__((always_inline)) inline Vec silu(Vec s) {
  const Vec t = exp_of_minus_magnitude(s);
  return (s < 0.0f ? s * t : s) / (1.0f + t);
}

// log(x) on every lane of a GCC vector of floats V, for x > 0 (0 gives -inf; +inf and NaN stay):
// x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(x) = e ln2 + 2 atanh(t), t = (m - 1) / (m + 1),
// |t| <= 0.172, by its series to t^9 (truncation below 1e-9 relative). Normal x only: subnormal
// positives come out wrong (the softmax sums it takes are at least 1).
template <typename V>
__attribute__((always_inline)) inline V log_positive(V x) {
  using Ints = typename IntsOf<V>::type;
  Ints bits;
  std::memcpy(&bits, &x, sizeof bits);
  const Ints exponent = (bits - 0x3f3504f3) >> 23;  // 0x3f3504f3: sqrt(1/2)'s bits
  const Ints mantissa_bits = bits - (exponent << 23);
  V m;
  std::memcpy(&m, &mantissa_bits, sizeof m);
  const V t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
  const V series = t * (2.0f + t2 * (2.0f / 3 + t2 * (2.0f / 5 + t2 * (2.0f / 7 + t2 * (2.0f / 9)))));
  const V result = __builtin_convertvector(exponent, V) * 0.693147182f + series;
  const V minus_infinity = V{} - __builtin_inff();
  return x > 0.0f ? (x < __builtin_inff() ? result : x) : (x == 0.0f ? minus_infinity : x);
}

}  // namespace afterburner::kernels::simd
