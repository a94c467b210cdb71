// The kernel contract for every op of the kernels area (see invariants.h), each against
// LibTorch's unfused ops: one row, one channel, odd and prime sizes, and strided, transposed,
// expanded (stride-0) and channels_last inputs, in every precision the op takes.
//
// Precisions: all ops fp32; bf16 tensors for all but the optimizers (FlatSGD/FlatAdamW refuse
// them: fp32 master weights only, tested below); bf16 autocast for the ops that follow autocast
// (linear_relu, linear, Conv2dReLU, low_rank_linear, fuse, attention, gelu, layer_norm, add_activation); fp64 where the
// op has a path of its own (gelu's, layer_norm's and add_activation's are LibTorch's).
// mm and addmm are the building blocks inside autograd functions and run there in the dtype they
// are given, and addmm_fused serves inference graphs in theirs, so they are checked on fp32, bf16
// and fp64 tensors rather than under autocast.
// Second-order gradients (create_graph) are checked where the backward is differentiable.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/kernels/add_activation.h"
#include "afterburner/kernels/attention.h"
#include "afterburner/kernels/conv_relu.h"
#include "afterburner/kernels/cross_entropy.h"
#include "afterburner/kernels/favor.h"
#include "afterburner/kernels/conv2d.h"
#include "afterburner/kernels/flat_optim.h"
#include "afterburner/kernels/fuse.h"
#include "afterburner/kernels/gelu.h"
#include "afterburner/kernels/gemm.h"
#include "afterburner/kernels/layer_norm.h"
#include "afterburner/kernels/linear_relu.h"
#include "afterburner/kernels/low_rank.h"
#include "afterburner/kernels/relu_maxpool.h"
#include "invariants.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

namespace F = torch::nn::functional;
using P = Precision;
using L = Layout;

const std::vector<Layout> kMatrixLayouts{L::contiguous, L::strided, L::transposed, L::expanded};
const std::vector<Layout> kImageLayouts{L::contiguous, L::strided, L::channels_last, L::expanded};

// Max-pooling selects, it does not round: the same values and gradients bit for bit.
Tolerance exact(Precision) { return {0, 0}; }

// `fp32` for fp32, the default tolerance for the other precisions.
std::function<Tolerance(Precision)> fp32_tolerance(Tolerance fp32) {
  return [fp32](Precision precision) { return precision == P::fp32 ? fp32 : default_tolerance(precision); };
}

// Under create_graph the op's backward runs LibTorch's differentiable ops, not the kernel's: its
// second order a case of its own, in fp32 (on `shapes` where given), so that the first case checks
// the kernel's own backward in every precision.
OpCase second_order_of(OpCase c, std::vector<Shape> shapes = {}) {
  c.name += ", second order";
  c.precisions = {P::fp32};
  if (!shapes.empty()) c.shapes = std::move(shapes);
  return differentiated_twice(c);
}

// kernels::mm and addmm on operands not requiring grad: their oneDNN path for fp32.
// Shapes {M, K, N}.
const std::vector<Shape> kGemmShapes{{1, 7, 5}, {13, 17, 11}, {4, 1, 3}, {1, 1, 1}, {2, 31, 1}};

OpCase mm_case() {
  return {"mm", {P::fp32, P::bf16, P::fp64}, kGemmShapes, kMatrixLayouts, [](Inputs& in, const Shape& s, Layout l) {
            const auto a = in.random({s[0], s[1]}, l, false), b = in.random({s[1], s[2]}, l, false);
            return Trial{[=] { return kernels::mm(a, b); }, [=] { return at::mm(a, b); }};
          }};
}

OpCase addmm_case() {
  return {"addmm", {P::fp32, P::bf16, P::fp64}, kGemmShapes, kMatrixLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto bias = in.random({s[2]}, l, false);
            const auto a = in.random({s[0], s[1]}, l, false), b = in.random({s[1], s[2]}, l, false);
            return Trial{[=] { return kernels::addmm(bias, a, b); }, [=] { return at::addmm(bias, a, b); }};
          }};
}

// kernels::bmm: one oneDNN GEMM per matrix for fp32. Shapes {B, M, K, N}.
OpCase bmm_case() {
  return {"bmm", {P::fp32, P::bf16, P::fp64}, {{1, 1, 1, 1}, {3, 13, 17, 11}, {2, 4, 1, 3}, {5, 2, 31, 1}},
          kMatrixLayouts, [](Inputs& in, const Shape& s, Layout l) {
            const auto a = in.random({s[0], s[1], s[2]}, l, false), b = in.random({s[0], s[2], s[3]}, l, false);
            return Trial{[=] { return kernels::bmm(a, b); }, [=] { return at::bmm(a, b); }};
          }};
}

// The inference product: oneDNN's matmul primitive for fp32 and bf16 operands not requiring grad.
// Shapes {M, K, N, gelu}.
OpCase addmm_fused_case() {
  return {"addmm_fused", {P::fp32, P::bf16, P::fp64},
          {{1, 7, 5, 1}, {13, 17, 11, 1}, {4, 1, 3, 0}, {1, 1, 1, 1}, {2, 31, 1, 0}, {67, 40, 33, 1}},
          kMatrixLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto epilogue = s[3] ? kernels::Epilogue::gelu : kernels::Epilogue::identity;
            const auto bias = in.random({s[2]}, l, false);
            const auto a = in.random({s[0], s[1]}, l, false), b = in.random({s[1], s[2]}, l, false);
            return Trial{[=] { return kernels::addmm_fused(bias, a, b, epilogue); },
                         [=] {
                           const auto product = at::addmm(bias, a, b);
                           return s[3] ? at::gelu(product) : product;
                         }};
          }};
}

// Called directly on tensors requiring grad, mm and addmm take LibTorch's path, so gradients flow;
// without grad mode they take oneDNN's, which rounds differently.
OpCase gemm_with_autograd_case() {
  OpCase c{"mm and addmm recording autograd", {P::fp32}, kGemmShapes, {L::contiguous, L::transposed},
           [](Inputs& in, const Shape& s, Layout l) {
             const auto bias = in.random({s[2]}, l);
             const auto a = in.random({s[0], s[1]}, l), b = in.random({s[1], s[2]}, l);
             return Trial{[=] { return kernels::addmm(bias, a, b) * kernels::mm(a, b); },
                          [=] { return at::addmm(bias, a, b) * at::mm(a, b); }};
           }};
  c.same_path_without_grad = false;
  return differentiated_twice(c);
}

// Shapes {M, K, N, has bias}; for M = 6, x is [2, 3, K], to cover leading dimensions.
OpCase linear_case(bool relu) {
  return {relu ? "linear_relu" : "linear",
          {P::fp32, P::bf16, P::autocast_bf16, P::fp64},
          {{1, 7, 5, 1}, {13, 17, 11, 1}, {4, 1, 3, 0}, {1, 1, 1, 1}, {6, 31, 2, 1}},
          kMatrixLayouts,
          [relu](Inputs& in, const Shape& s, Layout l) {
            const auto x = s[0] == 6 ? in.random({2, 3, s[1]}, l) : in.random({s[0], s[1]}, l);
            const auto weight = in.random({s[2], s[1]}, l);
            const auto bias = s[3] ? in.random({s[2]}, l) : torch::Tensor();
            if (!relu) return Trial{[=] { return kernels::linear(x, weight, bias); }, [=] { return F::linear(x, weight, bias); }};
            return Trial{[=] { return kernels::linear_relu(x, weight, bias); },
                         [=] { return torch::relu(F::linear(x, weight, bias)); }};
          }};
}

// The module, from Linear's default initialisation. Shapes {M, in, out}.
OpCase linear_relu_module_case() {
  return {"LinearReLU", {P::fp32, P::bf16, P::autocast_bf16}, {{1, 5, 3}, {7, 13, 11}}, kMatrixLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            kernels::LinearReLU layer(s[1], s[2]);
            layer->to(in.dtype());
            in.watch(*layer);
            const auto x = in.random({s[0], s[1]}, l);
            return Trial{[=]() mutable { return layer(x); },
                         [=] { return torch::relu(F::linear(x, layer->weight, layer->bias)); }};
          }};
}

// Shapes {N, C_in, H, W, C_out, kernel, stride, padding}.
OpCase conv_relu_case() {
  return {"Conv2dReLU",
          {P::fp32, P::bf16, P::autocast_bf16},
          {{1, 1, 5, 7, 3, 3, 1, 1}, {2, 3, 7, 5, 1, 3, 2, 0}, {3, 2, 11, 13, 5, 2, 1, 0}, {1, 3, 5, 5, 2, 1, 1, 0}},
          kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            kernels::Conv2dReLU conv(kernels::Conv2dReLUOptions(s[1], s[4], s[5]).stride(s[6]).padding(s[7]));
            conv->to(in.dtype());
            in.watch(*conv);
            const auto x = in.random({s[0], s[1], s[2], s[3]}, l);
            return Trial{[=]() mutable { return conv(x); },
                         [=] { return torch::relu(torch::conv2d(x, conv->weight, conv->bias, s[6], s[7])); }};
          }};
}

// Shapes {N, C, H, W, kernel, stride, padding}: one filter per channel (groups == C). The
// reference convolves in fp32 whatever the precision (at::convolution, which autocast leaves
// alone) and rounds to the op's dtype: LibTorch's bf16 backward multiplies the padding's zeros
// into the weight gradient (NaN where the output gradient is infinite), its fp32 one, like ours,
// does not (conv2d_test).
OpCase depthwise_conv_case() {
  return {"depthwise conv2d",
          {P::fp32, P::bf16, P::autocast_bf16},
          {{1, 1, 5, 7, 3, 1, 1}, {2, 17, 7, 5, 5, 2, 2}, {3, 24, 6, 6, 3, 2, 0}, {2, 40, 4, 4, 7, 1, 3}},
          kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto x = in.random({s[0], s[1], s[2], s[3]}, l);
            const auto w = in.random({s[1], 1, s[4], s[4]}, L::contiguous);
            const auto b = in.random({s[1]}, L::contiguous);
            const int64_t stride = s[5], padding = s[6], groups = s[1];
            return Trial{[=] { return kernels::conv2d(x, w, b, {stride, stride}, {padding, padding}, {1, 1}, groups); },
                         [=] {
                           const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
                           const auto y = at::convolution(f(x), f(w), f(b), {stride, stride}, {padding, padding},
                                                          {1, 1}, false, {0, 0}, groups);
                           return in_autocast_dtype(y.to(x.scalar_type()));
                         }};
          }};
}

// Shapes {N, C_in, C_out, kernel, stride, padding}: a 1-pixel image to a 1-pixel output, the
// linear layer kernels::conv2d makes of it. The reference convolves in fp32 or fp64 and rounds to
// the op's dtype: LibTorch's bf16 backward on 1-pixel images gives the taps that read only the
// padding gradients other than 0 (with a bias, finite inputs: 6.4 where 0 is right). Finite values
// only: for NaN and infinities LibTorch's fp32 convolution of a 1-pixel image multiplies the
// padding's zeros by the filters (an infinite weight on a padding tap makes the output NaN), its
// convolutions of larger images do not; ours follows the larger images (conv2d_test).
OpCase one_pixel_conv_case() {
  OpCase c{"conv2d on 1-pixel images",
          {P::fp32, P::bf16, P::autocast_bf16, P::fp64},
          {{1, 5, 7, 3, 1, 1}, {3, 16, 8, 5, 2, 2}, {4, 3, 6, 1, 1, 0}},
          kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto x = in.random({s[0], s[1], 1, 1}, l);
            const auto w = in.random({s[2], s[1], s[3], s[3]}, L::contiguous);
            const auto b = in.random({s[2]}, L::contiguous);
            const int64_t stride = s[4], padding = s[5];
            return Trial{[=] { return kernels::conv2d(x, w, b, {stride, stride}, {padding, padding}, {1, 1}, 1); },
                         [=] {
                           const auto wide = x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
                           const auto f = [wide](const torch::Tensor& t) { return t.to(wide); };
                           const auto y = at::convolution(f(x), f(w), f(b), {stride, stride}, {padding, padding},
                                                          {1, 1}, false, {0, 0}, 1);
                           return in_autocast_dtype(y.to(x.scalar_type()));
                         }};
          }};
  c.values = {Values::finite};
  return c;
}

// Shapes {N, C_in, C_out, H, W, kernel, stride, padding}: bf16 images of at most 4 output pixels,
// whose weight gradient kernels::conv2d computes as one GEMM. The reference convolves in fp32 and
// rounds to the op's dtype. Finite values only: the forward is LibTorch's bf16 convolution, which
// on strided inputs of stride-2 layers makes NaN where the fp32 one makes an infinity; the
// gradient's own NaN and infinities are checked in conv2d_test.
OpCase small_image_conv_case() {
  OpCase c{"conv2d on small images",
          {P::bf16, P::autocast_bf16},
          {{2, 8, 6, 2, 2, 3, 1, 1}, {3, 5, 7, 4, 4, 3, 2, 1}, {1, 6, 4, 2, 2, 3, 2, 1}, {2, 4, 3, 4, 4, 1, 2, 0}},
          kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto x = in.random({s[0], s[1], s[3], s[4]}, l);
            const auto w = in.random({s[2], s[1], s[5], s[5]}, L::contiguous);
            const auto b = in.random({s[2]}, L::contiguous);
            const int64_t stride = s[6], padding = s[7];
            return Trial{[=] { return kernels::conv2d(x, w, b, {stride, stride}, {padding, padding}, {1, 1}, 1); },
                         [=] {
                           const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
                           const auto y = at::convolution(f(x), f(w), f(b), {stride, stride}, {padding, padding},
                                                          {1, 1}, false, {0, 0}, 1);
                           return in_autocast_dtype(y.to(x.scalar_type()));
                         }};
          }};
  c.values = {Values::finite};
  return c;
}

// Shapes {N, C, H, W, kernel}: sizes not divisible by the kernel leave rows and columns outside
// every window (floor mode), whose gradient must be 0.
const std::vector<Shape> kPoolShapes{{1, 1, 4, 4, 2}, {2, 3, 7, 9, 2}, {1, 5, 9, 6, 3},
                                     {3, 2, 13, 11, 3}, {2, 1, 5, 5, 5}, {1, 3, 17, 19, 4}};

OpCase relu_max_pool_case() {
  return {"relu_max_pool2d", {P::fp32, P::bf16, P::fp64}, kPoolShapes, kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto x = in.random({s[0], s[1], s[2], s[3]}, l);
            const int64_t k = s[4];
            return Trial{[=] { return kernels::relu_max_pool2d(x, k, k); },
                         [=] { return torch::max_pool2d(torch::relu(x), k, k); }};
          },
          exact};
}

// Overlapping and padded windows {N, C, H, W, kernel, stride, padding}: torch's composition where
// a gradient is recorded, a kernel of ours without (the contract's no-grad call).
OpCase relu_max_pool_overlapping_case() {
  return {"relu_max_pool2d overlapping", {P::fp32, P::bf16, P::fp64},
          {{1, 1, 5, 5, 3, 2, 1}, {2, 3, 12, 11, 3, 2, 1}, {1, 4, 9, 10, 3, 1, 1}, {2, 9, 17, 18, 5, 3, 2}},
          kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto x = in.random({s[0], s[1], s[2], s[3]}, l);
            const auto options = kernels::ReluMaxPool2dOptions(s[4]).stride(s[5]).padding(s[6]);
            return Trial{[=] { return kernels::relu_max_pool2d(x, options); },
                         [=] { return torch::max_pool2d(torch::relu(x), s[4], s[5], s[6]); }};
          },
          exact};
}

OpCase relu_max_pool_module_case() {
  return {"ReluMaxPool2d", {P::fp32, P::bf16}, {{2, 3, 6, 6, 2}, {1, 1, 9, 10, 3}}, kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            kernels::ReluMaxPool2d pool(s[4]);
            const auto x = in.random({s[0], s[1], s[2], s[3]}, l);
            return Trial{[=]() mutable { return pool(x); },
                         [=] { return torch::max_pool2d(torch::relu(x), s[4], s[4]); }};
          },
          exact};
}

// Shapes {rows, classes}. One class: the loss and its gradient are 0.
OpCase cross_entropy_case() {
  return {"cross_entropy", {P::fp32, P::bf16, P::fp64}, {{1, 1}, {1, 7}, {13, 10}, {5, 31}, {64, 3}}, kMatrixLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto logits = in.random({s[0], s[1]}, l);
            const auto target = in.integers({s[0]}, s[1]);
            return Trial{[=] { return kernels::cross_entropy(logits, target); },
                         [=] { return F::cross_entropy(logits, target); }};
          }};
}

// Shapes {N, C, H, W}: one element, odd sizes, a row of 37 (two 16-lane blocks and a tail of 5),
// and 66,560 elements (two parallel tasks of the gradient).
OpCase gelu_case() {
  return {"gelu",
          {P::fp32, P::bf16, P::autocast_bf16, P::fp64},
          {{1, 1, 1, 1}, {2, 3, 5, 7}, {1, 1, 1, 37}, {2, 8, 64, 65}},
          kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto x = in.random({s[0], s[1], s[2], s[3]}, l);
            return Trial{[=] { return kernels::gelu(x); }, [=] { return torch::gelu(x); }};
          }};
}

// Shapes {N, C, H, W} as gelu's; both terms in one layout (the kernel's), the expanded one LibTorch's.
OpCase add_activation_case(kernels::Activation activation, const char* name) {
  return {name,
          {P::fp32, P::bf16, P::autocast_bf16, P::fp64},
          {{1, 1, 1, 1}, {2, 3, 5, 7}, {1, 1, 1, 37}, {2, 8, 64, 65}},
          kImageLayouts,
          [activation](Inputs& in, const Shape& s, Layout l) {
            const auto a = in.random({s[0], s[1], s[2], s[3]}, l), b = in.random({s[0], s[1], s[2], s[3]}, l);
            return Trial{[=] { return kernels::add_activation(a, b, activation); },
                         [=] {
                           const bool relu = activation == kernels::Activation::relu;
                           return relu ? torch::relu(a + b) : torch::silu(a + b);
                         }};
          }};
}

OpCase add_relu_case() { return add_activation_case(kernels::Activation::relu, "add + relu"); }
OpCase add_silu_case() { return add_activation_case(kernels::Activation::silu, "add + silu"); }

// Shapes {rows, features, affine}: one row, a tail of 5 after two 16-lane blocks, three 64-row
// blocks of the weight's partial sums, no weight and bias. A row of equal values (the expanded
// layout's) has variance 0, and rstd = 1 / sqrt(eps) = 316 magnifies the roundings of its mean:
// LibTorch's x rstd - mean rstd and the kernel's (x - mean) rstd differ there by more than fp32's
// default tolerance. bf16 outside autocast: against LibTorch's fp32 LayerNorm rounded to bf16
// (the kernel's contract); LibTorch's own bf16 kernel rounds along the way, and on such a row
// answers noise (-0.16 where the exact answer, the bias, is 0.03).
OpCase layer_norm_case() {
  OpCase c{"layer_norm",
          {P::fp32, P::bf16, P::autocast_bf16, P::fp64},
          {{1, 16, 1}, {7, 37, 1}, {130, 32, 1}, {3, 5, 0}},
          kMatrixLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            const auto x = in.random({s[0], s[1]}, l);
            const auto weight = s[2] ? in.random({s[1]}, l) : torch::Tensor();
            const auto bias = s[2] ? in.random({s[1]}, l) : torch::Tensor();
            return Trial{[=] { return kernels::layer_norm(x, {s[1]}, weight, bias, 1e-5); },
                         [=] {
                           if (x.scalar_type() != torch::kBFloat16 || at::autocast::is_cpu_enabled()) {
                             return torch::layer_norm(x, {s[1]}, weight, bias, 1e-5);
                           }
                           const auto widened = [](const torch::Tensor& t) {
                             return t.defined() ? t.to(torch::kFloat) : t;
                           };
                           return torch::layer_norm(widened(x), {s[1]}, widened(weight), widened(bias), 1e-5)
                               .to(torch::kBFloat16);
                         }};
          }};
  c.tolerance = fp32_tolerance({2e-5, 2e-5});
  return c;
}

// Shapes {M, K, R, N, has bias}.
OpCase low_rank_case() {
  return {"low_rank_linear",
          {P::fp32, P::bf16, P::autocast_bf16},
          {{1, 7, 3, 5, 1}, {13, 17, 2, 11, 1}, {4, 1, 1, 3, 0}, {6, 20, 5, 1, 1}},
          kMatrixLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            constexpr double kScale = 0.37;
            const auto x = in.random({s[0], s[1]}, l), a = in.random({s[1], s[2]}, l), b = in.random({s[2], s[3]}, l);
            const auto bias = s[4] ? in.random({s[3]}, l) : torch::Tensor();
            return Trial{[=] { return kernels::low_rank_linear(x, a, b, bias, kScale); },
                         [=] {
                           const auto projected = torch::mm(x, a) * kScale;
                           return bias.defined() ? torch::addmm(bias, projected, b) : torch::mm(projected, b);
                         }};
          }};
}

// Shapes {M, K, R, N, has bias, relu, dropout}: the epilogue against LibTorch's relu and dropout
// after the two products, both drawing dropout's noise from the default generator seeded alike.
OpCase low_rank_epilogue_case() {
  return {"low_rank_linear with relu and dropout",
          {P::fp32, P::bf16, P::autocast_bf16},
          {{13, 17, 2, 11, 1, 1, 1}, {1, 7, 3, 5, 1, 1, 0}, {6, 20, 5, 1, 1, 0, 1}, {4, 1, 1, 3, 0, 1, 1}},
          kMatrixLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            constexpr double kScale = 0.37, kP = 0.3;
            constexpr uint64_t kSeed = 19;
            const auto x = in.random({s[0], s[1]}, l), a = in.random({s[1], s[2]}, l), b = in.random({s[2], s[3]}, l);
            const auto bias = s[4] ? in.random({s[3]}, l) : torch::Tensor();
            const bool relu = s[5] != 0, dropout = s[6] != 0;
            return Trial{[=] {
                           torch::manual_seed(kSeed);
                           return kernels::low_rank_linear(
                               x, a, b, bias, kScale,
                               kernels::LowRankEpilogue().relu(relu).dropout(dropout ? kP : 0.0).train(true));
                         },
                         [=] {
                           torch::manual_seed(kSeed);
                           const auto projected = torch::mm(x, a) * kScale;
                           auto z = bias.defined() ? torch::addmm(bias, projected, b) : torch::mm(projected, b);
                           if (relu) z = torch::relu(z);
                           return dropout ? torch::dropout(z, kP, true) : z;
                         }};
          }};
}

// softmax(q k^T * scale + mask) v in LibTorch's unfused ops, torch 2.x's way (bool and causal
// masks become 0 / -inf and are added), computed in fp32 on the values the op reads (bf16 inputs,
// or under autocast the inputs rounded to bf16) with the result in the op's dtype: the kernel's
// stated numerics. The bf16 composition itself is no reference for the gradients: it rounds
// dP and softmax's row sums to bf16 before subtracting them, and where they cancel (identical
// keys and values, as an expanded layout draws: every score gradient is exactly 0) it leaves
// 0.04 where the answer is 0.
torch::Tensor unfused_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, const torch::Tensor& mask,
                                bool causal, double scale, const torch::Tensor& factors) {
  const at::ScalarType out_dtype = in_autocast_dtype(q).scalar_type();
  const at::ScalarType acc = out_dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  q = q.to(out_dtype).to(acc), k = k.to(out_dtype).to(acc), v = v.to(out_dtype).to(acc);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const auto additive = [&](const torch::Tensor& keep) {
    return torch::zeros(keep.sizes(), scores.options()).masked_fill(keep.logical_not(), -INFINITY);
  };
  if (mask.defined()) scores = scores + (mask.scalar_type() == torch::kBool ? additive(mask) : mask.to(acc));
  if (causal) scores = scores + additive(torch::ones({q.size(-2), k.size(-2)}, torch::kBool).tril());
  const torch::Tensor probabilities = torch::softmax(scores, -1);
  return torch::matmul(factors.defined() ? probabilities * factors.to(acc) : probabilities, v).to(out_dtype);
}

// Shapes {B, H, Lq, Lk, D, mask (0 none, 1 bool, 2 float), causal, dropout factors (0 or 1)},
// across both kernels' blocks (the tiled one's 64 query, 128 key rows; the short-key one's up to
// 128 keys, and its matrices across lanes: 36 of 17 rows). A bool mask keeps where a drawn value
// exceeds -1.5 (about 93%); a drawn NaN makes that element false. Dropout factors are 0 where a
// drawn value is below -1.3 (about 10%), else 1 / 0.9, as dropout's noise (a drawn NaN is NaN).
OpCase attention_case() {
  OpCase c{"attention",
           {P::fp32, P::bf16, P::autocast_bf16, P::fp64},
           {{1, 1, 1, 1, 8, 0, 0, 0}, {2, 3, 7, 5, 8, 1, 0, 0}, {1, 2, 5, 9, 16, 2, 1, 0}, {2, 1, 129, 65, 8, 0, 1, 0},
            {1, 1, 67, 131, 8, 1, 1, 0}, {2, 2, 17, 17, 8, 1, 0, 1}, {1, 2, 9, 140, 8, 0, 1, 1},
            {9, 4, 17, 17, 8, 1, 1, 1}},
           kMatrixLayouts,
           [](Inputs& in, const Shape& s, Layout l) {
             const auto q = in.random({s[0], s[1], s[2], s[4]}, l), k = in.random({s[0], s[1], s[3], s[4]}, l),
                        v = in.random({s[0], s[1], s[3], s[4]}, l);
             torch::Tensor mask;
             if (s[5] == 1) mask = in.random({s[0], 1, s[2], s[3]}, l, false) > -1.5;
             if (s[5] == 2) mask = in.random({s[2], s[3]}, l, false);
             const bool causal = s[6] != 0;
             torch::Tensor factors;
             if (s[7] == 1) {
               const torch::Tensor drawn = in.random({s[0], s[1], s[2], s[3]}, l, false);
               factors = (drawn >= -1.3).to(torch::kFloat) / 0.9 + drawn * 0;  // NaN stays NaN
             }
             const double scale = 1.0 / std::sqrt(static_cast<double>(s[4]));
             const auto optional = [](const torch::Tensor& t) { return t.defined() ? c10::make_optional(t) : c10::nullopt; };
             return Trial{[=] { return kernels::attention(q, k, v, optional(mask), causal, c10::nullopt, optional(factors)); },
                          [=] { return unfused_attention(q, k, v, mask, causal, scale, factors); }};
           }};
  // fp32 sums run over up to 131 keys.
  c.tolerance = fp32_tolerance({1e-5, 1e-5});
  return c;
}

// Performer's feature maps written out in LibTorch's ops: exp(x^ P^T - |x^|^2 / 2 - s) + 1e-5 with
// x^ = x d^-1/4, s the row's maximum (queries) or the (batch, head)'s (keys); relu(x P^T m^-1/2) + 1e-5.
torch::Tensor unfused_favor_features(const torch::Tensor& x, const torch::Tensor& projection,
                                     kernels::FavorFeatureMap map) {
  if (map == kernels::FavorFeatureMap::relu) {
    return torch::relu(torch::matmul(x, projection.t()) / std::sqrt(static_cast<double>(projection.size(0)))) + 1e-5;
  }
  const double scale = std::pow(static_cast<double>(x.size(-1)), -0.25);
  const torch::Tensor dash = torch::matmul(x * scale, projection.t());
  torch::Tensor stabilizer = dash.amax(-1, true);
  if (map == kernels::FavorFeatureMap::softmax_key) stabilizer = stabilizer.amax(-2, true);
  return torch::exp(dash - (x * scale).square().sum(-1, true) / 2 - stabilizer) + 1e-5;
}

// Shapes {B, H, L, d, m}: across the 16-lane blocks of m and the parallel tasks' 64 rows.
OpCase favor_features_case(kernels::FavorFeatureMap map, const char* name) {
  OpCase c{name, {P::fp32, P::fp64}, {{1, 1, 1, 1, 1}, {2, 3, 7, 5, 17}, {1, 2, 67, 8, 32}, {3, 1, 9, 16, 3}},
           kMatrixLayouts,
           [map](Inputs& in, const Shape& s, Layout l) {
             const auto x = in.random({s[0], s[1], s[2], s[3]}, l), projection = in.random({s[4], s[3]}, l);
             return Trial{[=] { return kernels::favor_features(x, projection, map); },
                          [=] { return unfused_favor_features(x, projection, map); }};
           }};
  c.tolerance = fp32_tolerance({1e-5, 1e-5});
  return c;
}

// phi(Q) (phi(K)^T V) / phi(Q) sum_j phi(k_j), 0 where the normaliser is; causal, the sums over
// j <= i. Shapes {B, H, L, S, m, dv, masked}: features |drawn| + 0.5 (features are positive),
// masked: query rows 0 and 3 and key rows 1 and 2 set to 0 in every (batch, head), as padding
// masks do. Causal shapes cross the kernel's 128-position blocks, with and without a tail; on
// finite values only: a NaN or infinite value at position j reaches the rows before j in its
// block of 128 (0 times NaN in the block's product), where the reference's [L, L] product
// spreads it to every row and the definition (sums over j <= i) to none.
OpCase favor_contraction_case(bool causal) {
  const std::vector<Shape> shapes =
      causal ? std::vector<Shape>{{1, 1, 1, 1, 3, 2, 0}, {2, 1, 7, 7, 5, 3, 1}, {1, 2, 130, 130, 9, 4, 1},
                                  {1, 1, 256, 256, 16, 8, 0}, {1, 1, 300, 300, 8, 5, 0}}
             : std::vector<Shape>{{1, 1, 1, 1, 1, 1, 0}, {2, 3, 7, 5, 17, 8, 0}, {1, 2, 67, 70, 32, 16, 1},
                                  {2, 1, 4, 3, 5, 3, 1}};
  OpCase c{causal ? "favor_contraction causal" : "favor_contraction", {P::fp32, P::fp64}, shapes, kMatrixLayouts,
           [causal](Inputs& in, const Shape& s, Layout l) {
             const auto qf = in.random({s[0], s[1], s[2], s[4]}, l), kf = in.random({s[0], s[1], s[3], s[4]}, l),
                        v = in.random({s[0], s[1], s[3], s[5]}, l);
             const auto dtype = in.dtype();
             auto kept = [dtype, masked = s[6] != 0](int64_t rows, std::vector<int64_t> dropped) {
               torch::Tensor keep = torch::ones({rows, 1}, dtype);
               for (const int64_t row : dropped) {
                 if (masked && row < rows) keep[row] = 0;
               }
               return keep;
             };
             const torch::Tensor query_keep = kept(s[2], {0, 3}), key_keep = kept(s[3], {1, 2});
             auto features = [=] { return std::make_pair((qf.abs() + 0.5) * query_keep, (kf.abs() + 0.5) * key_keep); };
             return Trial{[=] {
                            const auto [q, k] = features();
                            return kernels::favor_contraction(q, k, v, causal);
                          },
                          [=] {
                            const auto [q, k] = features();
                            torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1));
                            if (causal) scores = scores.tril();
                            const torch::Tensor normaliser = scores.sum(-1, true);
                            return torch::matmul(scores, v) / normaliser.masked_fill(normaliser == 0, 1);
                          }};
           }};
  c.tolerance = fp32_tolerance({1e-5, 1e-5});
  if (causal) c.values = {Values::finite};
  return c;
}

// fuse() on a small CNN against the model it rewrites (sharing its parameters): ReLU + MaxPool2d,
// Conv2d + ReLU and Linear + ReLU all fuse. Shapes {N}, images 8 x 8.
OpCase fuse_case() {
  return {"fuse", {P::fp32, P::bf16, P::autocast_bf16}, {{1}, {5}}, kImageLayouts,
          [](Inputs& in, const Shape& s, Layout l) {
            namespace nn = torch::nn;
            nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(2, 4, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                                 nn::Conv2d(nn::Conv2dOptions(4, 3, 3)), nn::ReLU(), nn::Flatten(), nn::Linear(12, 5),
                                 nn::ReLU(), nn::Linear(5, 3));
            model->to(in.dtype());
            const kernels::FuseResult result = kernels::fuse(model);
            EXPECT_EQ(result.fused.size(), 3u);
            nn::Sequential fused = result.model;
            in.watch(*model);
            const auto x = in.random({s[0], 2, 8, 8}, l);
            return Trial{[=]() mutable { return fused->forward(x); }, [=]() mutable { return model->forward(x); }};
          }};
}

class KernelContract : public ::testing::TestWithParam<OpCase> {};

TEST_P(KernelContract, HoldsForEveryPrecisionShapeAndLayout) { expect_kernel_contract(GetParam()); }

// Second-order gradients for every op whose backward is differentiable; relu_max_pool2d's refuses
// create_graph (relu_maxpool_test), and with it the fused CNN's. Convolutions in fp32 only: in
// LibTorch 1.13 the double backward of a bf16 conv2d throws a channel-count error of its own
// (Python's torch too).
INSTANTIATE_TEST_SUITE_P(Kernels, KernelContract,
                         ::testing::Values(mm_case(), bmm_case(), addmm_case(), addmm_fused_case(), gemm_with_autograd_case(),
                                           differentiated_twice(linear_case(true)),
                                           differentiated_twice(linear_case(false)),
                                           differentiated_twice(linear_relu_module_case()),
                                           differentiated_twice(conv_relu_case(), {P::fp32}),
                                           differentiated_twice(depthwise_conv_case(), {P::fp32}),
                                           differentiated_twice(one_pixel_conv_case(), {P::fp32}),
                                           small_image_conv_case(), relu_max_pool_case(),
                                           relu_max_pool_overlapping_case(), relu_max_pool_module_case(),
                                           differentiated_twice(cross_entropy_case()),
                                           differentiated_twice(low_rank_case()),
                                           differentiated_twice(low_rank_epilogue_case()), fuse_case(),
                                           gelu_case(), second_order_of(gelu_case()), layer_norm_case(),
                                           add_relu_case(), second_order_of(add_relu_case()), add_silu_case(),
                                           second_order_of(add_silu_case()),
                                           attention_case(),
                                           favor_features_case(kernels::FavorFeatureMap::softmax_query,
                                                               "favor_features softmax query"),
                                           favor_features_case(kernels::FavorFeatureMap::softmax_key,
                                                               "favor_features softmax key"),
                                           favor_features_case(kernels::FavorFeatureMap::relu, "favor_features relu"),
                                           second_order_of(favor_features_case(kernels::FavorFeatureMap::softmax_key,
                                                                               "favor_features softmax key")),
                                           favor_contraction_case(false), second_order_of(favor_contraction_case(false)),
                                           favor_contraction_case(true), second_order_of(favor_contraction_case(true)),
                                           second_order_of(attention_case(), {{2, 3, 7, 5, 8, 1, 0, 0},
                                                                              {1, 1, 67, 131, 8, 1, 1, 0},
                                                                              {2, 2, 17, 17, 8, 1, 0, 1}})),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string name;
                           for (const char ch : info.param.name) name += std::isalnum(ch) ? ch : '_';
                           return name;
                         });

// ---- The flat optimizers: the same contract for a step. ----
//
// Parameters of odd and prime sizes, one row, a transposed (non-contiguous) and a channels_last
// one; gradients installed as backward does after zero_grad(set_to_none), in each layout. Three
// steps of the flat optimizer against three of torch::optim's on copies of the same parameters.

using Params = std::vector<torch::Tensor>;
using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(const Params&)>;

struct OptimizerCase {
  std::string name;
  MakeOptimizer flat, reference;
};

void PrintTo(const OptimizerCase& c, std::ostream* out) { *out << c.name; }

Params make_params() {
  at::Generator generator = at::detail::createCPUGenerator(5);
  auto draw = [&](std::vector<int64_t> sizes) { return torch::randn(sizes, generator, torch::kFloat); };
  return {draw({1}),
          draw({7}),
          draw({1, 13}),
          draw({5, 3}).t(),
          draw({2, 3, 3, 3}).contiguous(at::MemoryFormat::ChannelsLast),
          draw({11, 2})};
}

Params requiring_grad(const Params& values) {
  Params params;
  for (const auto& v : values) params.push_back(v.detach().clone(at::MemoryFormat::Preserve).requires_grad_());
  return params;
}

// The gradients of step `step`, each laid out as `layout`.
Params gradients_for(const Params& params, int step, Layout layout) {
  Inputs inputs(torch::kFloat, 100 + step);
  Params grads;
  for (const auto& p : params) grads.push_back(inputs.random(p.sizes().vec(), layout, false));
  return grads;
}

struct StepResult {
  Params params;               // after the last step
  std::vector<Params> grads;   // the gradients installed at each step, as they were after it
  std::vector<Params> before;  // ... and as they were installed
};

StepResult run_steps(const MakeOptimizer& make, Layout layout) {
  constexpr int kSteps = 3;
  const Params params = requiring_grad(make_params());
  const Params initial = snapshot(params);
  const auto optimizer = make(params);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].detach(), initial[i])) << "building the optimizer changed parameter " << i;
  }
  StepResult result;
  for (int step = 0; step < kSteps; ++step) {
    const Params grads = gradients_for(params, step, layout);
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
    result.before.push_back(snapshot(grads));
    optimizer->step();
    result.grads.push_back(grads);
  }
  result.params = snapshot(params);
  for (const auto& grads : result.grads) {
    for (size_t i = 0; i < grads.size(); ++i) {
      for (size_t j = 0; j < params.size(); ++j) {
        EXPECT_FALSE(shares_memory(params[j], grads[i])) << "parameter " << j << " shares memory with gradient " << i;
      }
    }
  }
  return result;
}

class FlatOptimizerContract : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(FlatOptimizerContract, StepsLikeTorchWithoutTouchingTheGradients) {
  const OptimizerCase& c = GetParam();
  for (const Layout layout : kMatrixLayouts) {
    SCOPED_TRACE(to_string(layout));
    const StepResult first = run_steps(c.flat, layout);
    for (size_t step = 0; step < first.grads.size(); ++step) {
      expect_unchanged(first.grads[step], first.before[step], "by a step");
    }
    const StepResult second = run_steps(c.flat, layout);
    const StepResult expected = run_steps(c.reference, layout);
    for (size_t i = 0; i < first.params.size(); ++i) {
      EXPECT_TRUE(torch::equal(first.params[i], second.params[i])) << "parameter " << i << " differs on a second run";
      EXPECT_TRUE(Close(first.params[i], expected.params[i], default_tolerance(Precision::fp32))) << "parameter " << i;
    }
  }
}

// The flat optimizer and torch's own, built with the same options.
template <typename Flat, typename Torch, typename Options>
OptimizerCase optimizer_case(std::string name, const Options& options) {
  return {std::move(name), [options](const Params& p) { return std::make_unique<Flat>(p, options); },
          [options](const Params& p) { return std::make_unique<Torch>(p, options); }};
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, FlatOptimizerContract,
    ::testing::Values(optimizer_case<kernels::FlatSGD, torch::optim::SGD>("SGD", torch::optim::SGDOptions(0.1)),
                      optimizer_case<kernels::FlatSGD, torch::optim::SGD>(
                          "SGDNesterovWeightDecay",
                          torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-2)),
                      optimizer_case<kernels::FlatAdamW, torch::optim::AdamW>(
                          "AdamW", torch::optim::AdamWOptions(1e-2).weight_decay(0.1))),
    [](const ::testing::TestParamInfo<OptimizerCase>& info) { return info.param.name; });

// bf16 parameters are refused before anything moves: the parameter keeps its memory and values.
TEST(FlatOptimizerPrecision, RefusesBFloat16ParametersLeavingThemAsTheyWere) {
  const torch::Tensor bf16 = torch::randn({5}).to(torch::kBFloat16).requires_grad_();
  const torch::Tensor before = bf16.detach().clone();
  const void* memory = bf16.data_ptr();
  EXPECT_THROW(kernels::FlatSGD({bf16}, torch::optim::SGDOptions(0.1)), UsageError);
  EXPECT_THROW(kernels::FlatAdamW({bf16}, torch::optim::AdamWOptions(0.1)), UsageError);
  EXPECT_EQ(bf16.data_ptr(), memory);
  EXPECT_TRUE(torch::equal(bf16.detach(), before));
}

}  // namespace
}  // namespace afterburner::testing
