// ATen's elementwise activations on oneDNN tensors (`to_mkldnn()`, an optimized inference graph's),
// registered with the dispatcher for the MkldnnCPU key, which LibTorch 1.13 leaves without them:
// hardswish, hardsigmoid, hardtanh, clamp and silu, in place or not. Each runs ATen's own dense
// kernel over the tensor's whole buffer, in oneDNN's layout (blocked or plain), so values, NaN and
// infinities are ATen's, and the result stays a oneDNN tensor without a round trip through a
// dense one; padding channels (a blocked layout's last block) are set back to 0 afterwards.
// Linking afterburner is all it takes (no header):
//
//   auto y = torch::mkldnn_convolution(x.to_mkldnn(), w.to_mkldnn(), {}, {1, 1}, {1, 1}, {1, 1}, 1);
//   auto z = torch::hardswish(y);                         // a oneDNN tensor, as y's layout
//   torch::hardtanh_(y, 0.0, std::numeric_limits<double>::infinity());   // relu that keeps NaN
//
// infer::propagate_non_finite_as_aten and infer::move_onto_onednn move an optimized graph's
// activations onto these.
//
// And afterburner::broadcast_mul(a, b), a * b with ATen's broadcasting, whose oneDNN kernel
// multiplies a [N, C, H, W] tensor by a [N, C, 1, 1] one (a squeeze-and-excitation's scale) in
// the big one's layout, where LibTorch expands the small one to a full oneDNN tensor through a
// dense one first (prim::BroadcastMKLDNNTensors); infer::multiply_broadcasts_on_onednn and
// infer::move_onto_onednn rewrite optimized graphs to it.
//
// And afterburner::scale_shift_relu_to_onednn(x, scale, shift): a dense tensor's inference
// BatchNorm and ReLU written straight into a oneDNN tensor, with the largest magnitude written
// (DenseNet's layers begin so, after a concatenation LibTorch 1.13 computes densely);
// infer::batch_norm_relu_into_onednn rewrites to it.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "afterburner/core/ideep_tensor.h"
#include "afterburner/core/onednn_tensor.h"

namespace afterburner::kernels {
namespace {

// The whole buffer of `images` as a flat dense tensor of `like`'s dtype.
at::Tensor flat_buffer(const OnednnImages& images, const at::Tensor& like) {
  const int64_t count = images.images * images.height * images.width * images.depth;
  return at::from_blob(images.data, {count}, like.options().layout(at::kStrided));
}

// out = op(x) elementwise (apply(out, x) writes op(x) into out, both dense), a new oneDNN
// tensor in x's layout; other oneDNN tensors than OnednnImages go through dense ones.
template <typename Apply>
at::Tensor out_of_place(const at::Tensor& x, const Apply& apply) {
  const auto images = onednn_images(x);
  if (!images) {
    const at::Tensor dense = x.to_dense();
    at::Tensor out = at::empty_like(dense);
    apply(out, dense);
    return out.to_mkldnn();
  }
  at::Tensor out = empty_onednn_images(x, x.sizes());
  const auto out_images = *onednn_images(out);
  apply(flat_buffer(out_images, out), flat_buffer(*images, x));
  zero_padding_channels(out_images, x.size(1));
  return out;
}

// x = op(x) elementwise.
template <typename Apply>
at::Tensor& in_place(at::Tensor& x, const Apply& apply) {
  const auto images = onednn_images(x);
  if (!images) {
    x.copy_(out_of_place(x, apply));
    return x;
  }
  at::Tensor flat = flat_buffer(*images, x);
  apply(flat, flat);
  zero_padding_channels(*images, x.size(1));
  return x;
}

// The ops' maths, each ATen's own: apply(out, x).
void hardswish(at::Tensor out, const at::Tensor& x) { at::hardswish_out(out, x); }
void hardsigmoid(at::Tensor out, const at::Tensor& x) { at::hardsigmoid_out(out, x); }
void silu(at::Tensor out, const at::Tensor& x) { at::silu_out(out, x); }

template <void (*apply)(at::Tensor, const at::Tensor&)>
at::Tensor unary(const at::Tensor& x) {
  return out_of_place(x, apply);
}

template <void (*apply)(at::Tensor, const at::Tensor&)>
at::Tensor& unary_(at::Tensor& x) {
  return in_place(x, apply);
}

at::Tensor hardtanh(const at::Tensor& x, const at::Scalar& min, const at::Scalar& max) {
  return out_of_place(x, [&](at::Tensor out, const at::Tensor& in) { at::hardtanh_out(out, in, min, max); });
}

at::Tensor& hardtanh_(at::Tensor& x, const at::Scalar& min, const at::Scalar& max) {
  return in_place(x, [&](at::Tensor out, const at::Tensor& in) { at::hardtanh_out(out, in, min, max); });
}

at::Tensor clamp(const at::Tensor& x, const c10::optional<at::Scalar>& min, const c10::optional<at::Scalar>& max) {
  return out_of_place(x, [&](at::Tensor out, const at::Tensor& in) { at::clamp_out(out, in, min, max); });
}

at::Tensor& clamp_(at::Tensor& x, const c10::optional<at::Scalar>& min, const c10::optional<at::Scalar>& max) {
  return in_place(x, [&](at::Tensor out, const at::Tensor& in) { at::clamp_out(out, in, min, max); });
}

// Whether `scale` is [N, C, 1, 1] for `x` [N, C, H, W] of the same dtype.
bool scales_channels_of(const at::Tensor& scale, const at::Tensor& x) {
  return scale.dim() == 4 && x.dim() == 4 && scale.size(0) == x.size(0) && scale.size(1) == x.size(1) &&
         scale.size(2) == 1 && scale.size(3) == 1 && scale.scalar_type() == x.scalar_type();
}

// out = x * scale[n, c] on x's buffer: image i of `images` is channel block i % G of sample i / G
// (G = padded_channels / depth blocks a sample); its lane l is channel (i % G) * depth + l, and
// padding lanes (channels past C) are multiplied by 0.
template <typename scalar_t>
void scale_channels(const OnednnImages& images, int64_t channels, const scalar_t* scale, const scalar_t* x,
                    scalar_t* out) {
  const int64_t blocks = images.padded_channels / images.depth;
  const int64_t positions = images.height * images.width;
  const int64_t image_size = positions * images.depth;
  at::parallel_for(0, images.images, std::max<int64_t>(1, 32768 / image_size), [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> lanes(images.depth);
    for (int64_t image = begin; image < end; ++image) {
      const int64_t sample = image / blocks, first_channel = (image % blocks) * images.depth;
      for (int64_t l = 0; l < images.depth; ++l) {
        const int64_t channel = first_channel + l;
        lanes[l] = channel < channels ? scale[sample * channels + channel] : scalar_t(0);
      }
      const scalar_t* in = x + image * image_size;
      scalar_t* to = out + image * image_size;
      for (int64_t position = 0; position < positions; ++position) {
        const int64_t at = position * images.depth;
        for (int64_t l = 0; l < images.depth; ++l) to[at + l] = in[at + l] * lanes[l];
      }
    }
  });
}

at::Tensor dense_of(const at::Tensor& t) { return t.is_mkldnn() ? t.to_dense() : t; }

// One operand may be dense (a scale the graph computed densely): the result is a oneDNN tensor.
at::Tensor broadcast_mul_onednn(const at::Tensor& a, const at::Tensor& b) {
  if (a.is_mkldnn() && b.is_mkldnn() && a.sizes() == b.sizes()) return at::mul(a, b);
  const bool a_scales = scales_channels_of(a, b);
  const at::Tensor& x = a_scales ? b : a;
  const at::Tensor& scale = a_scales ? a : b;
  const auto images = onednn_images(x);
  if (!images || !scales_channels_of(scale, x)) return at::mul(dense_of(a), dense_of(b)).to_mkldnn();
  const at::Tensor dense_scale = dense_of(scale).contiguous();
  at::Tensor out = empty_onednn_images(x, x.sizes());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "broadcast_mul", [&] {
    scale_channels(*images, x.size(1), dense_scale.data_ptr<scalar_t>(), static_cast<const scalar_t*>(images->data),
                   static_cast<scalar_t*>(onednn_images(out)->data));
  });
  return out;
}

at::Tensor broadcast_mul_dense(const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); }

// ReLU as aten::relu computes it: 0 below 0, else the value itself (NaN and -0 kept).
inline float relu_keeping_nan(float v) { return v < 0.0f ? 0.0f : v; }

// |v|'s bits: ordered as the magnitudes are, NaN's above infinity's.
inline uint32_t magnitude_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

// One block of `depth` channels of one image, channel planes `plane` values apart:
// out[p * depth + l] = relu(in[l * plane + p] * scale[l] + shift[l]) for p < pixels and the
// `real` channels of the block, 0 for its padding lanes (l >= real); returns the largest
// magnitude_bits written. Not inlined into the AVX-512 kernel below, whose target has FMA: the
// product stays rounded.
__attribute__((noinline)) uint32_t scale_shift_relu_block(const float* in, int64_t plane, int64_t pixels,
                                                          const float* scale, const float* shift, int64_t real,
                                                          int64_t depth, float* out) {
  uint32_t largest = 0;
  if (depth == 1) {  // a plane of plain NCHW
    for (int64_t p = 0; p < pixels; ++p) {
      out[p] = relu_keeping_nan(in[p] * scale[0] + shift[0]);
      largest = std::max(largest, magnitude_bits(out[p]));
    }
    return largest;
  }
  for (int64_t p = 0; p < pixels; ++p) {
    for (int64_t l = 0; l < depth; ++l) {
      out[p * depth + l] = l < real ? relu_keeping_nan(in[l * plane + p] * scale[l] + shift[l]) : 0.0f;
      largest = std::max(largest, magnitude_bits(out[p * depth + l]));
    }
  }
  return largest;
}

#if defined(__x86_64__)
// r[j][i] = r[i][j] for 16 rows of 16 floats.
__attribute__((target("avx512f"))) inline void transpose_16x16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

// scale_shift_relu_block for a full block of 16 channels: 16 pixels of each channel's plane
// computed as one vector (the product and the sum each rounded, as the scalar form), then turned
// into 16 pixels of 16 channels. max(0, v) returns v for NaN and -0, as relu_keeping_nan.
__attribute__((target("avx512f"))) uint32_t scale_shift_relu_block16(const float* in, int64_t pixels,
                                                                     const float* scale, const float* shift,
                                                                     float* out) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i largest = _mm512_setzero_si512();
  int64_t p = 0;
  for (; p + 16 <= pixels; p += 16) {
    __m512 rows[16];
    for (int l = 0; l < 16; ++l) {
      const __m512 product = _mm512_mul_ps(_mm512_loadu_ps(in + l * pixels + p), _mm512_set1_ps(scale[l]));
      rows[l] = _mm512_max_ps(zero, _mm512_add_ps(product, _mm512_set1_ps(shift[l])));
      largest = _mm512_max_epu32(largest, _mm512_and_si512(_mm512_castps_si512(rows[l]), magnitude));
    }
    transpose_16x16(rows);
    for (int j = 0; j < 16; ++j) _mm512_storeu_ps(out + (p + j) * 16, rows[j]);
  }
  const uint32_t last = scale_shift_relu_block(in + p, pixels, pixels - p, scale, shift, 16, 16, out + p * 16);
  return std::max(last, static_cast<uint32_t>(_mm512_reduce_max_epu32(largest)));
}
#endif

// The channel block of the layout scale_shift_relu_to_onednn writes: oneDNN's fp32 convolutions
// read nChw16c on AVX-512 CPUs (a plain NCHW input costs them a reorder inside, about a quarter
// of a 1x1 convolution's time); elsewhere plain NCHW, their reorder's business.
int64_t written_channel_block() {
#if defined(__x86_64__)
  static const int64_t block = __builtin_cpu_supports("avx512f") ? 16 : 1;
  return block;
#else
  return 1;
#endif
}

// (y, bound): y = relu(x * scale[c] + shift[c]) for dense [N, C, H, W] fp32 x, written as a new
// oneDNN tensor (nChw16c where written_channel_block says so, else plain NCHW), and max|y| (+inf
// where y holds NaN or an infinity, or where it is not known): an inference BatchNorm (scale and
// shift as LibTorch's batch_norm computes them from its statistics), its ReLU and the conversion to
// a oneDNN tensor in one pass where LibTorch makes three, and the bound a fused convolution reading
// y would otherwise read y again for (infer::fuse_activations_into_convolutions). The product and
// the sum are each rounded (ATen 1.13's batch_norm differs from that in the last bit of some
// elements); NaN stays NaN, as aten::relu keeps it.
std::tuple<at::Tensor, double> scale_shift_relu_to_onednn(const at::Tensor& x, const at::Tensor& scale,
                                                          const at::Tensor& shift) {
  const auto channel_terms = [&](const at::Tensor& t) { return t.dim() == 1 && t.size(0) == x.size(1); };
  // Each image contiguous; images may lie apart (a channel slice: kernels/channel_concat.h).
  const bool images_contiguous = !x.is_mkldnn() && x.dim() == 4 && x.size(0) > 0 && x.select(0, 0).is_contiguous();
  if (x.dim() != 4 || x.scalar_type() != at::kFloat || x.is_mkldnn() || !images_contiguous ||
      !channel_terms(scale) || !channel_terms(shift)) {
    const auto per_channel = [](const at::Tensor& t) { return t.view({1, -1, 1, 1}); };
    return {at::relu(x * per_channel(scale) + per_channel(shift)).to_mkldnn(),
            std::numeric_limits<double>::infinity()};
  }
  const int64_t channels = x.size(1), pixels = x.size(2) * x.size(3), depth = written_channel_block();
  const ideep::tensor::desc layout(x.sizes().vec(), ideep::data_type::f32,
                                   depth == 16 ? ideep::format_tag::nChw16c : ideep::format_tag::nchw);
  at::Tensor out = onednn_tensor(ideep::tensor(layout));
  const at::Tensor scales = scale.to(at::kFloat).contiguous(), shifts = shift.to(at::kFloat).contiguous();
  const float* in = x.data_ptr<float>();
  const float *a = scales.data_ptr<float>(), *b = shifts.data_ptr<float>();
  auto* to = static_cast<float*>(onednn_images(out)->data);
  const int64_t blocks = (channels + depth - 1) / depth;  // per image
  const uint32_t largest = at::parallel_reduce(
      0, x.size(0) * blocks, 1, uint32_t{0},
      [&](int64_t begin, int64_t end, uint32_t partial) {
        for (int64_t index = begin; index < end; ++index) {
          const int64_t first = index % blocks * depth, real = std::min(depth, channels - first);
          const float* from = in + index / blocks * x.stride(0) + first * pixels;
          float* into = to + index * depth * pixels;
#if defined(__x86_64__)
          if (real == 16) {
            partial = std::max(partial, scale_shift_relu_block16(from, pixels, a + first, b + first, into));
            continue;
          }
#endif
          partial = std::max(partial, scale_shift_relu_block(from, pixels, pixels, a + first, b + first, real, depth,
                                                             into));
        }
        return partial;
      },
      [](uint32_t one, uint32_t other) { return std::max(one, other); });
  if (largest >= 0x7f800000u) return {out, std::numeric_limits<double>::infinity()};
  float bound;
  std::memcpy(&bound, &largest, sizeof bound);
  return {out, bound};
}

}  // namespace

TORCH_LIBRARY_IMPL(afterburner, CompositeExplicitAutograd, m) {
  m.impl("scale_shift_relu_to_onednn", TORCH_FN(scale_shift_relu_to_onednn));
}

TORCH_LIBRARY_IMPL(afterburner, CPU, m) { m.impl("broadcast_mul", TORCH_FN(broadcast_mul_dense)); }

TORCH_LIBRARY_IMPL(afterburner, MkldnnCPU, m) { m.impl("broadcast_mul", TORCH_FN(broadcast_mul_onednn)); }

TORCH_LIBRARY_IMPL(aten, MkldnnCPU, m) {
  m.impl("hardswish", TORCH_FN(unary<hardswish>));
  m.impl("hardswish_", TORCH_FN(unary_<hardswish>));
  m.impl("hardsigmoid", TORCH_FN(unary<hardsigmoid>));
  m.impl("hardsigmoid_", TORCH_FN(unary_<hardsigmoid>));
  m.impl("silu", TORCH_FN(unary<silu>));
  m.impl("silu_", TORCH_FN(unary_<silu>));
  m.impl("hardtanh", TORCH_FN(hardtanh));
  m.impl("hardtanh_", TORCH_FN(hardtanh_));
  m.impl("clamp", TORCH_FN(clamp));
  m.impl("clamp_", TORCH_FN(clamp_));
}

}  // namespace afterburner::kernels
