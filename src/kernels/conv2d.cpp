#include "afterburner/kernels/conv2d.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "afterburner/kernels/gemm.h"
#include "autocast_argument.h"
#include "simd.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using simd::kLanes;
using simd::load;
using simd::store;
using simd::Vec;

// Work items of the weight gradient (channel blocks x parts of the batch): enough for two threads
// to share evenly, and a function of the shape alone, so that the sums' order, and with it the
// result, does not depend on the thread count.
constexpr int64_t kWeightItems = 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A 2-element list from a 1- or 2-element one (an int[2] argument given as one int).
std::vector<int64_t> both_dims(at::IntArrayRef values) {
  return values.size() == 1 ? std::vector<int64_t>{values[0], values[0]} : values.vec();
}

// A depthwise convolution's sizes; x [N, H, W, C] and grad_y [N, OH, OW, C] are channels_last.
struct Geometry {
  int64_t batch, channels, height, width, out_height, out_width;
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;

  int64_t taps() const { return kernel_h * kernel_w; }
  int64_t blocks() const { return ceil_div(channels, kLanes); }
  // The input row (column) that tap row i (column j) of output row oh (column ow) reads: outside
  // [0, height) it reads the zero padding.
  int64_t input_row(int64_t oh, int64_t i) const { return oh * stride_h - pad_h + i * dilation_h; }
  int64_t input_col(int64_t ow, int64_t j) const { return ow * stride_w - pad_w + j * dilation_w; }
  // Offsets of pixels of x and of grad_y.
  int64_t in_offset(int64_t n, int64_t ih, int64_t iw) const { return ((n * height + ih) * width + iw) * channels; }
  int64_t out_offset(int64_t n, int64_t oh, int64_t ow) const {
    return ((n * out_height + oh) * out_width + ow) * channels;
  }
};

// The kernel sums in fp32 over 16 channels at a time (bf16 values widened on load), with the
// filter size KH x KW known at compile time so that the per-tap sums stay in registers.

// Adds output pixel (oh, ow)'s terms to sums[i * KW + j] and sums[KH * KW] (see
// weight_gradient_part) for the block's channels; x_rows[i] is x's row input_row(oh, i) at the
// block's first channel, nullptr outside the image. `inside`: every tap column lies inside the
// image; `full`: whole vectors can be read, else `lanes` values.
template <typename T, int KH, int KW, bool inside, bool full>
__attribute__((always_inline)) inline void add_pixel(const Geometry& g, const T* const* x_rows, const T* dy_at,
                                                     int64_t ow, int64_t lanes, Vec* sums) {
  const Vec dy = load<full>(dy_at, lanes);
  sums[KH * KW] += dy;
  const int64_t iw0 = g.input_col(ow, 0);
  for (int i = 0; i < KH; ++i) {
    if (x_rows[i] == nullptr) continue;
    for (int j = 0; j < KW; ++j) {
      const int64_t iw = iw0 + j * g.dilation_w;
      if (inside || (iw >= 0 && iw < g.width)) sums[i * KW + j] += dy * load<full>(x_rows[i] + iw * g.channels, lanes);
    }
  }
}

// Output rows summed per pass over a part's channel blocks, so that the input rows they read stay
// in cache from one block to the next.
constexpr int64_t kBandRows = 4;

// Adds image n's output rows [band, band + kBandRows) to one block's sums (see
// weight_gradient_part): from the columns' borders, where taps fall on the padding, and their inside.
template <typename T, int KH, int KW, bool full>
__attribute__((always_inline)) inline void add_band(const Geometry& g, const T* x, const T* grad_y, int64_t n,
                                                    int64_t band, int64_t c0, float* block_sums) {
  const int64_t lanes = std::min(kLanes, g.channels - c0);
  // Output columns whose taps all lie inside the image: [inner_begin, inner_end).
  const int64_t inner_begin = std::min(g.out_width, ceil_div(g.pad_w, g.stride_w));
  const int64_t last = g.width - 1 - (KW - 1) * g.dilation_w + g.pad_w;  // the last inside column * stride
  const int64_t inner_end =
      last < 0 ? inner_begin : std::max(inner_begin, std::min(g.out_width, last / g.stride_w + 1));
  Vec acc[KH * KW + 1];
  for (int t = 0; t <= KH * KW; ++t) acc[t] = load(block_sums + t * kLanes);
  for (int64_t oh = band; oh < std::min(band + kBandRows, g.out_height); ++oh) {
    const T* x_rows[KH];
    for (int i = 0; i < KH; ++i) {
      const int64_t ih = g.input_row(oh, i);
      x_rows[i] = ih < 0 || ih >= g.height ? nullptr : x + g.in_offset(n, ih, 0) + c0;
    }
    const T* dy = grad_y + g.out_offset(n, oh, 0) + c0;
    for (int64_t ow = 0; ow < inner_begin; ++ow) {
      add_pixel<T, KH, KW, false, full>(g, x_rows, dy + ow * g.channels, ow, lanes, acc);
    }
    for (int64_t ow = inner_begin; ow < inner_end; ++ow) {
      add_pixel<T, KH, KW, true, full>(g, x_rows, dy + ow * g.channels, ow, lanes, acc);
    }
    for (int64_t ow = inner_end; ow < g.out_width; ++ow) {
      add_pixel<T, KH, KW, false, full>(g, x_rows, dy + ow * g.channels, ow, lanes, acc);
    }
  }
  for (int t = 0; t <= KH * KW; ++t) store(block_sums + t * kLanes, acc[t]);
}

// For the images [n0, n1) and channel blocks [block0, block1): sums[block][i * KW + j][c] += the
// sum over output pixels (oh, ow) whose tap (i, j) lies inside the image of grad_y[n, oh, ow, c]
// x[n, input_row(oh, i), input_col(ow, j), c] (taps on the padding add nothing, as in LibTorch's
// fp32 backward, so an infinite grad_y there gives no NaN), and sums[block][KH * KW][c] += the
// sum of grad_y[n, oh, ow, c] (the bias gradient), c over the block's channels. sums is
// [blocks][KH * KW + 1][kLanes].
template <typename T, int KH, int KW>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten)) void weight_gradient_part(
    const Geometry& g, const T* x, const T* grad_y, int64_t n0, int64_t n1, int64_t block0, int64_t block1,
    float* sums) {
  const int64_t block_size = (KH * KW + 1) * kLanes;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t band = 0; band < g.out_height; band += kBandRows) {
      for (int64_t block = block0; block < block1; ++block) {
        float* block_sums = sums + block * block_size;
        // A last block of fewer than kLanes channels reads whole vectors too, the lanes past its
        // channels (the next pixel's) summed and dropped, except in the last image, whose last
        // pixel has no next one.
        if ((block + 1) * kLanes <= g.channels || n + 1 < g.batch) {
          add_band<T, KH, KW, true>(g, x, grad_y, n, band, block * kLanes, block_sums);
        } else {
          add_band<T, KH, KW, false>(g, x, grad_y, n, band, block * kLanes, block_sums);
        }
      }
    }
  }
}

// `body` with T the C++ type of `dtype` (fp32 or bf16) and KH, KW the filter's size, one of the
// sizes the kernels are compiled for (kernel_size below).
template <typename Body>
void with_types(at::ScalarType dtype, int64_t kernel_h, int64_t kernel_w, Body body) {
  const auto with_size = [&](auto zero) {
    if (kernel_h == 3 && kernel_w == 3) return body(zero, std::integral_constant<int, 3>{});
    if (kernel_h == 5 && kernel_w == 5) return body(zero, std::integral_constant<int, 5>{});
    return body(zero, std::integral_constant<int, 7>{});
  };
  if (dtype == at::kBFloat16) {
    with_size(c10::BFloat16{});
  } else {
    with_size(float{});
  }
}

// The square filter sizes compiled for: MobileNets' and EfficientNets' 3 and 5, ConvNeXt's 7.
bool kernel_size(const torch::Tensor& weight) {
  const int64_t size = weight.size(2);
  return weight.size(3) == size && (size == 3 || size == 5 || size == 7);
}

// The weight's and the bias's gradients ([C, 1, KH, KW] and [C], in x's dtype) from x and grad_y
// (channels_last): the kernel's sums per part of the batch and group of channel blocks, then added
// up part after part.
std::pair<torch::Tensor, torch::Tensor> weight_gradients(const Geometry& g, const torch::Tensor& x,
                                                         const torch::Tensor& grad_y) {
  const int64_t blocks = g.blocks();
  const int64_t parts = std::min(g.batch, kWeightItems);
  const int64_t groups = std::min(blocks, ceil_div(kWeightItems, parts));
  const int64_t block_size = (g.taps() + 1) * kLanes;
  std::vector<float> partial(parts * blocks * block_size, 0.f);
  with_types(x.scalar_type(), g.kernel_h, g.kernel_w, [&](auto zero, auto size) {
    using T = decltype(zero);
    at::parallel_for(0, parts * groups, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t part = item / groups, group = item % groups;
        weight_gradient_part<T, size, size>(g, x.data_ptr<T>(), grad_y.data_ptr<T>(), part * g.batch / parts,
                                            (part + 1) * g.batch / parts, group * blocks / groups,
                                            (group + 1) * blocks / groups,
                                            partial.data() + part * blocks * block_size);
      }
    });
  });
  torch::Tensor grad_w = torch::zeros({g.channels, g.taps()}, torch::kFloat);
  torch::Tensor grad_b = torch::zeros({g.channels}, torch::kFloat);
  float* w = grad_w.data_ptr<float>();
  float* b = grad_b.data_ptr<float>();
  for (int64_t part = 0; part < parts; ++part) {
    for (int64_t block = 0; block < blocks; ++block) {
      const float* sums = partial.data() + (part * blocks + block) * block_size;
      const int64_t c0 = block * kLanes, lanes = std::min(kLanes, g.channels - c0);
      for (int64_t tap = 0; tap < g.taps(); ++tap) {
        for (int64_t c = 0; c < lanes; ++c) w[(c0 + c) * g.taps() + tap] += sums[tap * kLanes + c];
      }
      for (int64_t c = 0; c < lanes; ++c) b[c0 + c] += sums[g.taps() * kLanes + c];
    }
  }
  return {grad_w.view({g.channels, 1, g.kernel_h, g.kernel_w}).to(x.scalar_type()), grad_b.to(x.scalar_type())};
}

// Dense CPU images and filters with elements, and valid options (LibTorch's own path reports invalid ones).
bool dense_cpu_images(const torch::Tensor& x, const torch::Tensor& weight, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation) {
  const auto positive = [](at::IntArrayRef values) {
    return values.size() == 2 && std::all_of(values.begin(), values.end(), [](int64_t v) { return v > 0; });
  };
  return x.dim() == 4 && weight.dim() == 4 && x.numel() > 0 && x.device().is_cpu() && x.layout() == at::kStrided &&
         weight.layout() == at::kStrided && positive(stride) && positive(dilation) && padding.size() == 2 &&
         padding[0] >= 0 && padding[1] >= 0;
}

// Whether a convolution's weight gradient is ours: depthwise (one filter per channel), fp32 or bf16 (fp64
// and others keep LibTorch's path, whose NaN propagation at the padding differs from oneDNN's),
// dense_cpu_images, and a filter size the kernels are compiled for.
bool depthwise(const torch::Tensor& x, const torch::Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding,
               at::IntArrayRef dilation, int64_t groups) {
  const auto dtype = x.scalar_type();
  return dense_cpu_images(x, weight, stride, padding, dilation) && x.size(1) == groups && weight.size(0) == groups &&
         weight.size(1) == 1 && kernel_size(weight) && (dtype == at::kFloat || dtype == at::kBFloat16) &&
         weight.scalar_type() == dtype;
}

// Output pixels per image up to which a bf16 convolution's weight gradient is
// weight_gradient_by_gemm's: on images this small oneDNN's direct backward-weights kernel ran at a
// quarter of its forward's rate (6.5 ms against 1.5 ms for ResNet-18's 256-channel 3x3 layers on
// 2x2 images, batch 128, ONEDNN_VERBOSE).
constexpr int64_t kSmallImageOutputPixels = 4;

int64_t output_extent(int64_t size, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return (size + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// Whether a convolution's weight gradient is weight_gradient_by_gemm's: bf16 (the dtype measured),
// one group, at most kSmallImageOutputPixels output pixels per image, dense CPU tensors and valid
// options.
bool small_images(const torch::Tensor& x, const torch::Tensor& weight, at::IntArrayRef stride,
                  at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  if (!dense_cpu_images(x, weight, stride, padding, dilation) || groups != 1 || weight.size(1) != x.size(1) ||
      weight.numel() == 0 || x.scalar_type() != at::kBFloat16 || weight.scalar_type() != at::kBFloat16) {
    return false;
  }
  const int64_t height = output_extent(x.size(2), weight.size(2), stride[0], padding[0], dilation[0]);
  const int64_t width = output_extent(x.size(3), weight.size(3), stride[1], padding[1], dilation[1]);
  return height > 0 && width > 0 && height * width <= kSmallImageOutputPixels;
}

// grad_w[o, c, i, j] = sum over n, oh, ow of grad_y[n, o, oh, ow] x[n, c, input_row(oh, i),
// input_col(ow, j)] (zero where the tap reads the padding): one GEMM, grad_y as [N*OH*OW, O]
// transposed times the values the taps read, [N*OH*OW, KH*KW*C]; returned in the weight's layout.
// The GEMM multiplies the padding's zeros in, which oneDNN skips: with an infinite or NaN grad_y
// the taps on the padding would be NaN where LibTorch's are finite, so conv2d_backward keeps such
// gradients on LibTorch's path.
torch::Tensor weight_gradient_by_gemm(const torch::Tensor& grad_y, const torch::Tensor& x, const torch::Tensor& weight,
                                      at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  const auto channels_last = at::MemoryFormat::ChannelsLast;
  const torch::Tensor images = x.contiguous(channels_last);
  const Geometry g{x.size(0),      x.size(1),      x.size(2), x.size(3), grad_y.size(2), grad_y.size(3),
                   weight.size(2), weight.size(3), stride[0], stride[1], padding[0],     padding[1],
                   dilation[0],    dilation[1]};
  const int64_t pixels = g.out_height * g.out_width, row_size = g.taps() * g.channels;
  torch::Tensor read = torch::zeros({g.batch * pixels, row_size}, images.options());  // 0: the padding
  const auto* from = images.data_ptr<at::BFloat16>();
  auto* to = read.data_ptr<at::BFloat16>();
  at::parallel_for(0, g.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t oh = 0; oh < g.out_height; ++oh) {
        for (int64_t ow = 0; ow < g.out_width; ++ow) {
          at::BFloat16* row = to + ((n * g.out_height + oh) * g.out_width + ow) * row_size;
          for (int64_t i = 0; i < g.kernel_h; ++i) {
            const int64_t ih = g.input_row(oh, i);
            for (int64_t j = 0; j < g.kernel_w && ih >= 0 && ih < g.height; ++j) {
              const int64_t iw = g.input_col(ow, j);
              if (iw < 0 || iw >= g.width) continue;
              std::memcpy(row + (i * g.kernel_w + j) * g.channels, from + g.in_offset(n, ih, iw),
                          g.channels * sizeof(at::BFloat16));
            }
          }
        }
      }
    }
  });
  const int64_t outputs = weight.size(0);
  const torch::Tensor grad_rows = grad_y.contiguous(channels_last).permute({0, 2, 3, 1}).reshape({-1, outputs});
  return kernels::mm(grad_rows.t(), read)
      .view({outputs, g.kernel_h, g.kernel_w, g.channels})
      .permute({0, 3, 1, 2})
      .contiguous(weight.suggest_memory_format());
}

// y = conv2d(x, w, b), depthwise or of small images, whose weight and bias gradients are ours
// (conv2d_backward). Forward and input gradient: LibTorch's.
struct Conv2dFunction : torch::autograd::Function<Conv2dFunction> {
  // The bias is optional rather than an undefined tensor: autograd Functions take no undefined inputs.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias, std::vector<int64_t> stride,
                               std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["groups"] = groups;
    ctx->save_for_backward({x, weight});
    return at::convolution(x, weight, bias, stride, padding, dilation, false, {0, 0}, groups);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    auto [grad_x, grad_weight, grad_bias] = conv2d_backward(
        grad_outputs[0], saved[0], saved[1], has_bias, ctx->saved_data["stride"].toIntVector(),
        ctx->saved_data["padding"].toIntVector(), ctx->saved_data["dilation"].toIntVector(),
        ctx->saved_data["groups"].toInt(),
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), has_bias && ctx->needs_input_grad(2)});
    return {grad_x, grad_weight, grad_bias, {}, {}, {}, {}};
  }
};

// The filter tap (row, column) through which a 1-pixel image reaches a 1-pixel output, if x is
// one and groups is 1: output pixel 0 reads input row tap * dilation - padding, 0 for tap =
// padding / dilation.
c10::optional<std::pair<int64_t, int64_t>> one_pixel_tap(const torch::Tensor& x, const torch::Tensor& weight,
                                                        at::IntArrayRef stride, at::IntArrayRef padding,
                                                        at::IntArrayRef dilation, int64_t groups) {
  if (x.dim() != 4 || weight.dim() != 4 || x.layout() != at::kStrided || groups != 1 || x.size(2) != 1 ||
      x.size(3) != 1 || x.size(1) == 0 || weight.size(1) != x.size(1) || stride.size() != 2 || padding.size() != 2 ||
      dilation.size() != 2) {
    return c10::nullopt;
  }
  int64_t tap[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t kernel = weight.size(2 + d), reach = dilation[d] * (kernel - 1);
    const bool one_output = stride[d] > 0 && 2 * padding[d] - reach >= 0 && 2 * padding[d] - reach < stride[d];
    if (!one_output || dilation[d] < 1 || padding[d] % dilation[d] != 0 || padding[d] / dilation[d] >= kernel) {
      return c10::nullopt;
    }
    tap[d] = padding[d] / dilation[d];
  }
  return std::make_pair(tap[0], tap[1]);
}

// w[:, :, row, column] as a new [O, C] tensor of `dtype`. Its gradient is zero but at that tap and
// laid out as w is: autograd's select would hand back a contiguous one, which AccumulateGrad then
// copies into a channels-last weight's layout (17 ms a step for one 512x512x3x3 weight, with the
// 10 ms of casting the whole zero-padded gradient to fp32 before it).
struct FilterTapFunction : torch::autograd::Function<FilterTapFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight, int64_t row, int64_t column,
                               at::ScalarType dtype) {
    ctx->saved_data["row"] = row;
    ctx->saved_data["column"] = column;
    ctx->save_for_backward({weight});
    return weight.select(3, column).select(2, row).to(dtype, /*non_blocking=*/false, /*copy=*/true);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    torch::Tensor grad = torch::zeros_like(ctx->get_saved_variables()[0]);
    grad.select(3, ctx->saved_data["column"].toInt()).select(2, ctx->saved_data["row"].toInt()).copy_(grad_outputs[0]);
    return {grad, {}, {}, {}};
  }
};

}  // namespace

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> conv2d_backward(
    const torch::Tensor& grad_y, const torch::Tensor& x, const torch::Tensor& weight, bool has_bias,
    at::IntArrayRef stride_list, at::IntArrayRef padding_list, at::IntArrayRef dilation_list, int64_t groups,
    std::array<bool, 3> needed) {
  const auto stride = both_dims(stride_list), padding = both_dims(padding_list);
  const auto dilation = both_dims(dilation_list);
  needed[2] = needed[2] && has_bias;
  const bool of_depthwise = depthwise(x, weight, stride, padding, dilation, groups);
  const bool ours = of_depthwise || (small_images(x, weight, stride, padding, dilation, groups) &&
                                     grad_y.isfinite().all().item<bool>());
  if (torch::GradMode::is_enabled() || !ours || grad_y.scalar_type() != x.scalar_type() || grad_y.dim() != 4) {
    const std::vector<int64_t> bias_sizes{weight.size(0)};
    return at::convolution_backward(grad_y, x, weight, has_bias ? c10::make_optional<at::IntArrayRef>(bias_sizes)
                                                                : c10::nullopt,
                                    stride, padding, dilation, false, {0, 0}, groups, needed);
  }
  torch::Tensor grad_x, grad_weight, grad_bias;
  if (needed[0]) {  // LibTorch's (oneDNN's): a kernel of ours measured 1-2x slower in bf16
    grad_x = std::get<0>(at::convolution_backward(grad_y, x, weight, c10::nullopt, stride, padding, dilation, false,
                                                  {0, 0}, groups, {true, false, false}));
  }
  if (!of_depthwise) {  // small images
    if (needed[1]) grad_weight = weight_gradient_by_gemm(grad_y, x, weight, stride, padding, dilation);
    if (needed[2]) grad_bias = grad_y.sum({0, 2, 3});
  } else if (needed[1] || needed[2]) {
    const Geometry g{x.size(0),      x.size(1),      x.size(2), x.size(3), grad_y.size(2), grad_y.size(3),
                     weight.size(2), weight.size(3), stride[0], stride[1], padding[0],     padding[1],
                     dilation[0],    dilation[1]};
    const auto channels_last = at::MemoryFormat::ChannelsLast;
    auto [w, b] = weight_gradients(g, x.contiguous(channels_last), grad_y.contiguous(channels_last));
    if (needed[1]) grad_weight = w;
    if (needed[2]) grad_bias = b;
  }
  return {grad_x, grad_weight, grad_bias};
}

torch::Tensor conv2d(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     at::IntArrayRef stride_list, at::IntArrayRef padding_list, at::IntArrayRef dilation_list,
                     int64_t groups) {
  if (x.dim() == 3) {  // unbatched, as Conv2d takes it
    return conv2d(x.unsqueeze(0), weight, bias, stride_list, padding_list, dilation_list, groups).squeeze(0);
  }
  const auto stride = both_dims(stride_list), padding = both_dims(padding_list);
  const auto dilation = both_dims(dilation_list);
  const torch::Tensor input = autocast_argument(x);
  const auto optional_bias = bias.defined() ? c10::make_optional(autocast_argument(bias)) : c10::nullopt;
  if (const auto tap = one_pixel_tap(input, weight, stride, padding, dilation, groups)) {
    // y[n, o] = b[o] + sum over c of w[o, c, tap] x[n, c]: the other taps read the padding.
    const torch::Tensor weights = FilterTapFunction::apply(weight, tap->first, tap->second, autocast_dtype(weight));
    return at::linear(input.flatten(1), weights, optional_bias).view({x.size(0), weight.size(0), 1, 1});
  }
  const torch::Tensor filters = autocast_argument(weight);
  const bool recording = torch::GradMode::is_enabled() &&
                         (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (recording && (depthwise(input, filters, stride, padding, dilation, groups) ||
                    small_images(input, filters, stride, padding, dilation, groups))) {
    return Conv2dFunction::apply(input, filters, optional_bias, stride, padding, dilation, groups);
  }
  return at::convolution(input, filters, optional_bias, stride, padding, dilation, false, {0, 0}, groups);
}

}  // namespace afterburner::kernels
