#include "afterburner/kernels/conv2d.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "afterburner/core/threads.h"
#include "non_finite.h"
#include "testing.h"

namespace afterburner::kernels {
namespace {

using afterburner::testing::AgreesWithNonFinite;
using afterburner::testing::Contains;
using afterburner::testing::Identical;

constexpr const char* kOurNode = "Conv2dFunction";

// A depthwise convolution's shape and options.
struct Geometry {
  int64_t batch, channels, height, width, kernel;
  std::vector<int64_t> stride, padding, dilation;
  bool bias = true;
};

std::ostream& operator<<(std::ostream& out, const Geometry& g) {
  return out << "[" << g.batch << ", " << g.channels << ", " << g.height << ", " << g.width << "] kernel "
             << g.kernel << " stride " << c10::IntArrayRef(g.stride) << " padding " << c10::IntArrayRef(g.padding)
             << " dilation " << c10::IntArrayRef(g.dilation) << (g.bias ? "" : " no bias");
}

// One filter per channel; channel counts below, at and above a vector of 16 and not multiples of
// it; strides, paddings (also larger than the filter's reach) and dilations of MobileNets and
// beyond; images of 1 pixel (where LibTorch's oneDNN backward is slowest) to 15.
const std::vector<Geometry> kGeometries{
    {1, 1, 5, 5, 3, {1, 1}, {1, 1}, {1, 1}},       {2, 3, 7, 5, 3, {1, 1}, {1, 1}, {1, 1}},
    {7, 17, 9, 11, 5, {2, 2}, {2, 2}, {1, 1}},     {3, 16, 6, 6, 3, {3, 3}, {0, 0}, {1, 1}, false},
    {2, 88, 7, 7, 3, {1, 1}, {1, 1}, {1, 1}},      {4, 130, 13, 13, 3, {1, 1}, {2, 2}, {2, 2}},
    {9, 40, 1, 1, 5, {1, 1}, {2, 2}, {1, 1}},      {5, 24, 2, 3, 5, {2, 1}, {2, 2}, {1, 1}},
    {2, 33, 15, 14, 7, {1, 1}, {3, 3}, {1, 1}},    {1, 20, 4, 4, 3, {1, 2}, {0, 1}, {1, 1}, false},
    {3, 48, 8, 8, 5, {1, 1}, {4, 4}, {1, 1}},      {64, 32, 7, 7, 3, {2, 2}, {1, 1}, {1, 1}}};

struct Gradients {
  torch::Tensor y, x, weight, bias;
  std::string node;  // the autograd node of y: ours or LibTorch's
};

// y = conv(x, weight, bias) and the gradients of x, weight and bias for the upstream gradient
// grad_y, each input a fresh leaf keeping its layout.
template <typename Conv>
Gradients gradients(const Conv& conv, const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                    const torch::Tensor& grad_y) {
  const auto leaf = [](const torch::Tensor& t) { return t.defined() ? t.detach().requires_grad_() : t; };
  const torch::Tensor xl = leaf(x), wl = leaf(weight), bl = leaf(bias);
  const torch::Tensor y = conv(xl, wl, bl);
  std::vector<torch::Tensor> inputs{xl, wl};
  if (bl.defined()) inputs.push_back(bl);
  const auto grads = torch::autograd::grad({y}, inputs, {grad_y});
  return {y.detach(), grads[0], grads[1], bl.defined() ? grads[2] : torch::Tensor(), y.grad_fn()->name()};
}

struct Case {
  Geometry g;
  torch::Tensor x, weight, bias, grad_y;
};

// Random values of `dtype` (exactly representable in every precision compared), x in `format`.
Case make_case(const Geometry& g, torch::Dtype dtype, at::MemoryFormat format) {
  const auto opts = torch::dtype(dtype);
  Case c{g, torch::randn({g.batch, g.channels, g.height, g.width}, opts).contiguous(format),
         torch::randn({g.channels, 1, g.kernel, g.kernel}, opts),
         g.bias ? torch::randn({g.channels}, opts) : torch::Tensor(), {}};
  const auto y = torch::conv2d(c.x, c.weight, c.bias, g.stride, g.padding, g.dilation, g.channels);
  c.grad_y = torch::randn(y.sizes(), opts).contiguous(format);
  return c;
}

Gradients ours(const Case& c) {
  return gradients(
      [&](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
        return kernels::conv2d(x, w, b, c.g.stride, c.g.padding, c.g.dilation, c.g.channels);
      },
      c.x, c.weight, c.bias, c.grad_y);
}

// LibTorch's convolution on the case's values in `dtype`.
Gradients libtorch(const Case& c, torch::Dtype dtype) {
  const auto to = [dtype](const torch::Tensor& t) { return t.defined() ? t.to(dtype) : t; };
  return gradients(
      [&](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
        return torch::conv2d(x, w, b, c.g.stride, c.g.padding, c.g.dilation, c.g.channels);
      },
      to(c.x), to(c.weight), to(c.bias), to(c.grad_y));
}

// |ours - reference| within tol of the reference's largest magnitude (sums of up to a few thousand
// terms: fp32 rounding; bf16 inputs are exact in double, so only the fp32 sums and the one final
// rounding to bf16 differ).
::testing::AssertionResult Near(const torch::Tensor& actual, const torch::Tensor& expected, double tol) {
  const torch::Tensor magnitudes = expected.detach().to(torch::kDouble).abs();
  const torch::Tensor finite = magnitudes.masked_select(magnitudes.isfinite());
  const double largest = finite.numel() == 0 ? 0.0 : finite.max().item<double>();
  return AgreesWithNonFinite(actual, expected, tol * std::max(1.0, largest), tol);
}

TEST(DepthwiseConv2d, GradientsMatchLibTorchInDoubleForEveryGeometry) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const double tol = dtype == torch::kFloat ? 1e-5 : 1e-2;
    for (const auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
      for (const Geometry& g : kGeometries) {
        torch::manual_seed(g.channels);
        const Case c = make_case(g, dtype, format);
        const Gradients got = ours(c), expected = libtorch(c, torch::kDouble);
        const bool nchw = format == at::MemoryFormat::Contiguous;
        SCOPED_TRACE(::testing::Message() << g << " " << dtype << (nchw ? " NCHW" : " NHWC"));
        EXPECT_TRUE(Contains(got.node, kOurNode));
        EXPECT_TRUE(Near(got.y, expected.y, tol)) << "output";
        EXPECT_TRUE(Near(got.x, expected.x, tol)) << "input gradient";
        EXPECT_TRUE(Near(got.weight, expected.weight, tol)) << "weight gradient";
        if (g.bias) {
          EXPECT_TRUE(Near(got.bias, expected.bias, tol)) << "bias gradient";
        }
        EXPECT_EQ(got.weight.scalar_type(), dtype);
        EXPECT_EQ(got.weight.sizes(), c.weight.sizes());
        EXPECT_TRUE(got.x.is_contiguous(c.x.suggest_memory_format())) << "input gradient in x's memory format";
      }
    }
  }
}

TEST(DepthwiseConv2d, SecondCallsAndOtherThreadCountsGiveTheSameBits) {
  for (const Geometry& g : {kGeometries[2], kGeometries[4], kGeometries[11]}) {
    torch::manual_seed(3);
    const Case c = make_case(g, torch::kFloat, at::MemoryFormat::ChannelsLast);
    Gradients first, second, one_thread;
    {
      ThreadsGuard threads(2);
      first = ours(c);
      second = ours(c);
    }
    {
      ThreadsGuard threads(1);
      one_thread = ours(c);
    }
    SCOPED_TRACE(::testing::Message() << g);
    EXPECT_TRUE(Identical(second.weight, first.weight));
    EXPECT_TRUE(Identical(second.bias, first.bias));
    EXPECT_TRUE(Identical(second.x, first.x));
    // The weight gradient's sums are split by the shape, not by the threads.
    EXPECT_TRUE(Identical(one_thread.weight, first.weight));
    EXPECT_TRUE(Identical(one_thread.bias, first.bias));
  }
}

// NaN and infinities where LibTorch's fp32 convolution (oneDNN) puts them: a NaN or an infinity
// in x reaches the gradients of its own channel's taps that read it, and taps on the padding add
// nothing, so an infinite output gradient in a corner makes no NaN there. LibTorch itself is not
// consistent about the last point: its bf16 backward (5x5 filters) and its fp32 one for 1-pixel
// images multiply the padding's zeros by the infinity (NaN), as its fp64 path always does. Ours
// adds nothing at every size and in both dtypes, so bf16 is checked against LibTorch's fp32 on the
// same values, and 1-pixel images against the rule itself.
TEST(DepthwiseConv2d, NonFiniteValuesPropagateAsLibTorchsDo) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const Geometry& g : {kGeometries[1], kGeometries[2], kGeometries[7]}) {
      torch::manual_seed(5);
      Case c = make_case(g, dtype, at::MemoryFormat::ChannelsLast);
      c.x[0][0][g.height / 2][g.width / 2] = kNaN;
      c.x[g.batch - 1][1][0][g.width - 1] = kInf;
      c.grad_y[0][2][0][0] = kInf;
      const Gradients got = ours(c), expected = libtorch(c, torch::kFloat);
      SCOPED_TRACE(::testing::Message() << g << " " << dtype);
      const double tol = dtype == torch::kFloat ? 1e-5 : 1e-2;
      EXPECT_TRUE(Near(got.weight, expected.weight, tol));
      EXPECT_TRUE(Near(got.bias, expected.bias, tol));
      EXPECT_TRUE(Identical(got.x, libtorch(c, dtype).x));  // LibTorch's own input gradient
      EXPECT_TRUE(got.weight.isnan().any().item<bool>() && !got.weight.isnan().all().item<bool>());
    }
  }
  // A 1-pixel image, 5x5 filters: only the centre tap reads the image.
  const Geometry& g = kGeometries[6];
  Case c = make_case(g, torch::kFloat, at::MemoryFormat::ChannelsLast);
  c.grad_y[0][2][0][0] = kInf;
  const torch::Tensor grad = ours(c).weight[2][0].reshape(-1);
  EXPECT_TRUE(std::isinf(grad[12].item<double>()));
  EXPECT_TRUE(grad.narrow(0, 0, 12).isfinite().all().item<bool>());
  EXPECT_TRUE(grad.narrow(0, 13, 12).isfinite().all().item<bool>());
}

TEST(DepthwiseConv2d, InputsAreLeftUnchanged) {
  torch::manual_seed(6);
  const Case c = make_case(kGeometries[4], torch::kBFloat16, at::MemoryFormat::Contiguous);
  const auto before = std::vector<torch::Tensor>{c.x.clone(), c.weight.clone(), c.bias.clone(), c.grad_y.clone()};
  ours(c);
  EXPECT_TRUE(Identical(c.x, before[0]));
  EXPECT_TRUE(Identical(c.weight, before[1]));
  EXPECT_TRUE(Identical(c.bias, before[2]));
  EXPECT_TRUE(Identical(c.grad_y, before[3]));
}

// Other convolutions, other dtypes and filter sizes, calls without a gradient to record and
// backward passes that build a graph (create_graph) run LibTorch's own.
TEST(DepthwiseConv2d, EverythingElseRunsLibTorchsConvolution) {
  torch::manual_seed(7);
  const auto x = torch::randn({2, 4, 6, 6}, torch::requires_grad());
  const auto run = [&](const torch::Tensor& input, const torch::Tensor& w, int64_t groups) {
    return kernels::conv2d(input, w, {}, {1, 1}, {1, 1}, {1, 1}, groups);
  };
  EXPECT_TRUE(Contains(run(x, torch::randn({4, 1, 3, 3}, torch::requires_grad()), 4).grad_fn()->name(), kOurNode));
  EXPECT_EQ(run(x, torch::randn({8, 1, 3, 3}, torch::requires_grad()), 4).grad_fn()->name(), "ConvolutionBackward0");
  EXPECT_EQ(run(x, torch::randn({4, 2, 3, 3}, torch::requires_grad()), 2).grad_fn()->name(), "ConvolutionBackward0");
  EXPECT_EQ(run(x, torch::randn({4, 1, 4, 4}, torch::requires_grad()), 4).grad_fn()->name(), "ConvolutionBackward0");
  EXPECT_EQ(run(x.to(torch::kDouble), torch::randn({4, 1, 3, 3}, torch::kDouble), 4).grad_fn()->name(),
            "ConvolutionBackward0");
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(run(x, torch::randn({4, 1, 3, 3}), 4).requires_grad());
  }
  // A second derivative: LibTorch's differentiable backward.
  const auto w = torch::randn({4, 1, 3, 3}, torch::requires_grad());
  const auto y = run(x, w, 4);
  const auto second_derivative = [&](const torch::Tensor& out) {
    const auto gx = torch::autograd::grad({out.square().sum()}, {x}, {}, /*retain_graph=*/true,
                                          /*create_graph=*/true)[0];
    return torch::autograd::grad({gx.sum()}, {w})[0];
  };
  const auto ggw = second_derivative(y);
  const auto ggw_ref = second_derivative(torch::conv2d(x, w, {}, 1, 1, 1, 4));
  EXPECT_TRUE(torch::allclose(ggw, ggw_ref, 1e-5, 1e-5));
}

TEST(DepthwiseConv2d, UnbatchedInputsAndAutocastAsTorchConv2d) {
  torch::manual_seed(8);
  const auto x = torch::randn({4, 6, 6}, torch::requires_grad());
  const auto w = torch::randn({4, 1, 3, 3}, torch::requires_grad());
  const auto y = kernels::conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, 4);
  EXPECT_TRUE(torch::allclose(y, torch::conv2d(x, w, {}, 1, 1, 1, 4), 1e-5, 1e-5));
  {
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
    const auto batched = x.unsqueeze(0);
    const auto ours_y = kernels::conv2d(batched, w, {}, {1, 1}, {1, 1}, {1, 1}, 4);
    const auto torch_y = torch::conv2d(batched, w, {}, 1, 1, 1, 4);
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
    EXPECT_EQ(ours_y.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(Identical(ours_y, torch_y));  // the same oneDNN forward
    const auto g = torch::autograd::grad({ours_y.to(torch::kFloat).sum()}, {w})[0];
    const auto g_ref = torch::autograd::grad({torch_y.to(torch::kFloat).sum()}, {w})[0];
    EXPECT_EQ(g.scalar_type(), torch::kFloat);  // through autocast's cast, to the fp32 weight
    EXPECT_TRUE(torch::allclose(g, g_ref, 1e-2, 1e-2));
  }
}

// A 1-pixel image convolved to a 1-pixel output: {N, C_in, C_out, kernel, stride, padding,
// dilation}. The tap padding / dilation reads the pixel, the others the padding.
const std::vector<std::vector<int64_t>> kOnePixel{{1, 5, 7, 3, 1, 1, 1},  {3, 16, 8, 5, 1, 2, 1},
                                                  {64, 9, 12, 1, 1, 0, 1}, {2, 6, 6, 3, 2, 1, 1},
                                                  {7, 4, 3, 3, 1, 2, 2},   {2, 3, 5, 3, 3, 2, 1}};

torch::Tensor one_pixel_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                             const std::vector<int64_t>& s) {
  return kernels::conv2d(x, w, b, {s[4], s[4]}, {s[5], s[5]}, {s[6], s[6]}, 1);
}

TEST(Conv2dOnePixel, IsALinearLayerOnTheTapThatReadsThePixelWithLibTorchsGradients) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
    const double tol = dtype == torch::kDouble ? 1e-12 : dtype == torch::kFloat ? 1e-5 : 1e-2;
    for (const auto& s : kOnePixel) {
      for (const auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
        torch::manual_seed(s[1]);
        const auto opts = torch::dtype(dtype);
        const auto x = torch::randn({s[0], s[1], 1, 1}, opts).contiguous(format);
        const auto w = torch::randn({s[2], s[1], s[3], s[3]}, opts);
        const auto b = torch::randn({s[2]}, opts);
        const auto grad_y = torch::randn({s[0], s[2], 1, 1}, opts);
        const auto conv = [&](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
          return one_pixel_conv(xi, wi, bi, s);
        };
        const auto reference = [&](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
          return torch::conv2d(xi, wi, bi, s[4], s[5], s[6]);
        };
        const auto to64 = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
        const Gradients got = gradients(conv, x, w, b, grad_y);
        const Gradients want = gradients(reference, to64(x), to64(w), to64(b), to64(grad_y));
        SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(s) << " " << dtype);
        EXPECT_TRUE(Contains(got.node, "ViewBackward")) << got.node;  // the linear layer's, not a convolution's
        EXPECT_EQ(got.y.scalar_type(), dtype);
        EXPECT_EQ(got.y.sizes(), want.y.sizes());
        EXPECT_TRUE(Near(got.y, want.y, tol)) << "output";
        EXPECT_TRUE(Near(got.x, want.x, tol)) << "input gradient";
        EXPECT_TRUE(Near(got.weight, want.weight, tol)) << "weight gradient";
        EXPECT_TRUE(Near(got.bias, want.bias, tol)) << "bias gradient";
        const Gradients again = gradients(conv, x, w, b, grad_y);
        EXPECT_TRUE(Identical(again.y, got.y));
        EXPECT_TRUE(Identical(again.weight, got.weight));
      }
    }
  }
}

// The weight's gradient comes in the weight's own dtype and layout (so that AccumulateGrad keeps it
// rather than copying it into the parameter's), holding the bits of the same linear layer on a dense
// copy of the tap of the weight cast whole, as autocast casts it.
TEST(Conv2dOnePixel, WeightGradientIsLaidOutAsTheWeightWithTheBitsOfTheCastWholeWeight) {
  for (const bool autocast : {false, true}) {
    for (const auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
      torch::manual_seed(4);
      const auto x = torch::randn({6, 24, 1, 1});
      const auto w = torch::randn({16, 24, 3, 3}).contiguous(format);
      const auto b = torch::randn({16});
      const auto grad_y = torch::randn({6, 16, 1, 1});
      const auto cast = [&](const torch::Tensor& t) { return autocast ? t.to(torch::kBFloat16) : t; };
      const auto whole_weight_cast = [&](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
        const auto tap = cast(wi).select(3, 1).select(2, 1).contiguous();
        return at::linear(cast(xi).flatten(1), tap, cast(bi)).view({xi.size(0), wi.size(0), 1, 1});
      };
      const auto conv = [](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
        return kernels::conv2d(xi, wi, bi, {1, 1}, {1, 1}, {1, 1}, 1);
      };
      at::autocast::set_cpu_enabled(autocast);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      const Gradients got = gradients(conv, x, w, b, grad_y);
      const Gradients again = gradients(conv, x, w, b, grad_y);
      at::autocast::set_cpu_enabled(false);
      at::autocast::clear_cache();
      const Gradients want = gradients(whole_weight_cast, x, w, b, grad_y);
      SCOPED_TRACE(::testing::Message() << "autocast " << autocast << " " << format);
      EXPECT_EQ(got.weight.scalar_type(), torch::kFloat);
      EXPECT_EQ(got.weight.strides(), w.strides());
      EXPECT_TRUE(Identical(got.y, want.y));
      EXPECT_TRUE(Identical(got.x, want.x));
      EXPECT_TRUE(Identical(got.weight, want.weight));
      EXPECT_TRUE(Identical(got.bias, want.bias));
      EXPECT_TRUE(Identical(again.weight, got.weight));
    }
  }
}

// A NaN or an infinity in the pixel or on the tap that reads it propagates as LibTorch's does; the
// other taps read the padding and add nothing, whatever they hold (LibTorch's convolutions of
// larger images do the same; of 1-pixel ones, multiply their zeros in: NaN).
TEST(Conv2dOnePixel, NonFiniteValuesOnTheReadingTapPropagateAndThePaddingAddsNothing) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  torch::manual_seed(10);
  auto x = torch::randn({3, 4, 1, 1});
  auto w = torch::randn({5, 4, 3, 3});
  x[0][1][0][0] = kNaN;
  w[2][3][1][1] = kInf;   // the centre: read
  w[4][0][0][0] = kNaN;   // a corner: padding only
  const auto grad_y = torch::randn({3, 5, 1, 1});
  const auto conv = [](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
    return kernels::conv2d(xi, wi, bi, {1, 1}, {1, 1}, {1, 1}, 1);
  };
  const Gradients got = gradients(conv, x, w, {}, grad_y);
  // LibTorch on the centre tap alone (a 1x1 filter, no padding) computes what the padding adds nothing to.
  const auto centre = [](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
    return torch::conv2d(xi, wi.narrow(2, 1, 1).narrow(3, 1, 1), bi);
  };
  const Gradients want = gradients(centre, x, w, {}, grad_y);
  EXPECT_TRUE(Near(got.y, want.y, 1e-6));
  EXPECT_TRUE(Near(got.x, want.x, 1e-6));
  const auto centre_tap = [](const torch::Tensor& t) { return t.narrow(2, 1, 1).narrow(3, 1, 1); };
  EXPECT_TRUE(Near(centre_tap(got.weight), centre_tap(want.weight), 1e-6));
  EXPECT_TRUE(got.y[0].isnan().all().item<bool>());                               // the NaN pixel's image
  EXPECT_TRUE(std::isinf(got.y[1][2][0][0].item<double>()));                      // the infinite centre weight
  EXPECT_TRUE(got.y.select(1, 4).narrow(0, 1, 2).isfinite().all().item<bool>());  // the NaN corner: not read
  torch::Tensor off_centre = got.weight.clone();
  off_centre.select(3, 1).select(2, 1).zero_();
  EXPECT_TRUE(off_centre.eq(0).all().item<bool>()) << "a tap that reads the padding has a gradient";
}

TEST(Conv2dOnePixel, OtherImagesAndGeometriesRunLibTorchsConvolution) {
  torch::manual_seed(9);
  const auto w = torch::randn({4, 3, 3, 3}, torch::requires_grad());
  const auto node = [&](const torch::Tensor& x, int64_t stride, int64_t padding, int64_t dilation) {
    return kernels::conv2d(x, w, {}, {stride, stride}, {padding, padding}, {dilation, dilation}, 1).grad_fn()->name();
  };
  const auto pixel = torch::randn({2, 3, 1, 1});
  EXPECT_TRUE(Contains(node(pixel, 1, 1, 1), "ViewBackward"));
  EXPECT_EQ(node(torch::randn({2, 3, 2, 2}), 1, 1, 1), "ConvolutionBackward0");  // 2x2 images
  EXPECT_EQ(node(pixel, 1, 2, 1), "ConvolutionBackward0");                      // a 3x3 output
  EXPECT_EQ(node(pixel, 3, 3, 2), "ConvolutionBackward0");  // no tap reads the pixel: the bias alone
  // A bad geometry is LibTorch's error.
  EXPECT_THROW(kernels::conv2d(pixel, w, {}, {1, 1}, {0, 0}, {1, 1}, 1), c10::Error);
}

// bf16 convolutions of images with at most 4 output pixels: {N, C_in, C_out, H, W, kernel,
// stride, padding, dilation}. ResNet-18's last stages on 28-pixel inputs (2x2 images, 4 -> 2 and
// 2 -> 1 with stride 2, a 1x1 shortcut), a 3-pixel image, dilation, a row.
const std::vector<std::vector<int64_t>> kSmallImages{
    {7, 24, 16, 2, 2, 3, 1, 1, 1}, {5, 8, 12, 4, 4, 3, 2, 1, 1}, {3, 16, 8, 2, 2, 3, 2, 1, 1},
    {2, 6, 10, 4, 4, 1, 2, 0, 1},  {1, 5, 7, 3, 3, 3, 2, 1, 1},  {4, 6, 6, 3, 3, 3, 1, 1, 2},
    {2, 4, 5, 1, 4, 3, 1, 1, 1},   {64, 32, 32, 2, 2, 3, 1, 1, 1}};

torch::Tensor small_image_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                               const std::vector<int64_t>& s) {
  return kernels::conv2d(x, w, b, {s[6], s[6]}, {s[7], s[7]}, {s[8], s[8]}, 1);
}

struct SmallImageCase {
  torch::Tensor x, weight, bias, grad_y;
};

SmallImageCase small_image_case(const std::vector<int64_t>& s, at::MemoryFormat format, bool bias) {
  torch::manual_seed(s[1] + s[3]);
  const auto opts = torch::dtype(torch::kBFloat16);
  SmallImageCase c{torch::randn({s[0], s[1], s[3], s[4]}, opts).contiguous(format),
                   torch::randn({s[2], s[1], s[5], s[5]}, opts).contiguous(format),
                   bias ? torch::randn({s[2]}, opts) : torch::Tensor(), {}};
  const auto y = torch::conv2d(c.x, c.weight, c.bias, s[6], s[7], s[8]);
  c.grad_y = torch::randn(y.sizes(), opts).contiguous(format);
  return c;
}

TEST(Conv2dSmallImages, Bf16GradientsMatchLibTorchInDoubleLaidOutAsTheirTensors) {
  for (const auto& s : kSmallImages) {
    for (const auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
      for (const bool bias : {false, true}) {
        const SmallImageCase c = small_image_case(s, format, bias);
        const auto conv = [&](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
          return small_image_conv(xi, wi, bi, s);
        };
        const auto reference = [&](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
          return torch::conv2d(xi, wi, bi, s[6], s[7], s[8]);
        };
        const auto to64 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kDouble) : t; };
        const Gradients got = gradients(conv, c.x, c.weight, c.bias, c.grad_y);
        const Gradients want = gradients(reference, to64(c.x), to64(c.weight), to64(c.bias), to64(c.grad_y));
        SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(s) << " " << format << " bias " << bias);
        EXPECT_TRUE(Contains(got.node, kOurNode)) << got.node;
        EXPECT_TRUE(Near(got.y, want.y, 1e-2)) << "output";
        EXPECT_TRUE(Near(got.x, want.x, 1e-2)) << "input gradient";
        EXPECT_TRUE(Near(got.weight, want.weight, 1e-2)) << "weight gradient";
        if (bias) {
          EXPECT_TRUE(Near(got.bias, want.bias, 1e-2)) << "bias gradient";
        }
        EXPECT_EQ(got.weight.scalar_type(), torch::kBFloat16);
        EXPECT_TRUE(got.weight.is_contiguous(c.weight.suggest_memory_format())) << "laid out as the weight";
        const Gradients again = gradients(conv, c.x, c.weight, c.bias, c.grad_y);
        EXPECT_TRUE(Identical(again.y, got.y));
        EXPECT_TRUE(Identical(again.x, got.x));
        EXPECT_TRUE(Identical(again.weight, got.weight));
        if (bias) {
          EXPECT_TRUE(Identical(again.bias, got.bias));
        }
      }
    }
  }
}

// A NaN or an infinity in x reaches the gradients of the taps that read it, as in LibTorch's double
// backward on the same values (its bf16 one, oneDNN's, puts NaN on some taps that read the padding
// of stride-2 layers, by the values the padding stands next to). An infinite or NaN output gradient
// takes LibTorch's bf16 backward, whose taps on the padding add nothing where the GEMM would
// multiply the padding's zeros by it: the same bits.
TEST(Conv2dSmallImages, NonFiniteValuesPropagateAsLibTorchsBackwardDoes) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (const auto& s : {kSmallImages[0], kSmallImages[1], kSmallImages[2]}) {
    SmallImageCase c = small_image_case(s, at::MemoryFormat::ChannelsLast, true);
    c.x[0][1][0][0] = kNaN;
    c.x[s[0] - 1][2][s[3] - 1][s[4] - 1] = -kInf;
    const auto conv = [&](const torch::Tensor& xi, const torch::Tensor& wi, const torch::Tensor& bi) {
      return small_image_conv(xi, wi, bi, s);
    };
    for (const bool infinite_grad_y : {false, true}) {
      if (infinite_grad_y) c.grad_y[s[0] - 1][3][0][0] = kInf;
      const Gradients got = gradients(conv, c.x, c.weight, c.bias, c.grad_y);
      const auto dtype = infinite_grad_y ? torch::kBFloat16 : torch::kDouble;
      const auto [grad_x, grad_weight, grad_bias] = at::convolution_backward(
          c.grad_y.to(dtype), c.x.to(dtype), c.weight.to(dtype), std::vector<int64_t>{s[2]}, {s[6], s[6]},
          {s[7], s[7]}, {s[8], s[8]}, false, {0, 0}, 1, {true, true, true});
      SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(s) << " infinite grad_y " << infinite_grad_y);
      EXPECT_FALSE(got.weight.isfinite().all().item<bool>());
      if (infinite_grad_y) {
        EXPECT_TRUE(Identical(got.weight, grad_weight));
        EXPECT_TRUE(Identical(got.bias, grad_bias));
        EXPECT_TRUE(Identical(got.x, grad_x));
      } else {
        EXPECT_TRUE(Near(got.weight, grad_weight, 1e-2));
        EXPECT_TRUE(Near(got.bias, grad_bias, 1e-2));
        EXPECT_TRUE(Near(got.x, grad_x, 1e-2));
      }
    }
  }
}

TEST(Conv2dSmallImages, Fp32LargerOutputsAndGroupsRunLibTorchsConvolution) {
  const auto node = [](torch::Dtype dtype, int64_t size, int64_t groups) {
    const auto w = torch::randn({4, 4 / groups, 3, 3}, torch::dtype(dtype).requires_grad(true));
    return kernels::conv2d(torch::randn({2, 4, size, size}, dtype), w, {}, {1, 1}, {1, 1}, {1, 1}, groups)
        .grad_fn()
        ->name();
  };
  EXPECT_TRUE(Contains(node(torch::kBFloat16, 2, 1), kOurNode));
  EXPECT_EQ(node(torch::kFloat, 2, 1), "ConvolutionBackward0");     // fp32: oneDNN skips the padding
  EXPECT_EQ(node(torch::kBFloat16, 3, 1), "ConvolutionBackward0");  // 9 output pixels
  EXPECT_EQ(node(torch::kBFloat16, 2, 2), "ConvolutionBackward0");  // grouped
}

}  // namespace
}  // namespace afterburner::kernels
