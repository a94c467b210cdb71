// convolve_3x3_by_winograd and afterburner::conv2d_winograd, as prepare_for_inference runs them:
// over the 3x3 geometries of ResNets and DenseNets, at batch 1, 2, 7 and 8, the prepared model's
// convolution is within 32 fp32 epsilons of the outputs' scale of the double-precision answer,
// twice the same, its input left alone; images holding NaN or an infinity, and geometries where Winograd does not
// pay, give LibTorch's own bits; images of more sizes than the transforms kept still give
// Winograd's answer; other convolutions are left to LibTorch.
#include "afterburner/infer/winograd_conv.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/script.h>

#include <limits>
#include <string>
#include <vector>

#include "afterburner/infer/optimize.h"
#include "non_finite.h"
#include "test_models.h"

namespace afterburner::infer::winograd_test {
namespace {
namespace jit = torch::jit;
using testing::BitwiseEqual;

struct Geometry {
  int64_t channels, size, out_channels, padding;
  bool bias;
};

std::string describe(const Geometry& g, int64_t batch) {
  return fmt::format("{} -> {} channels over {} px, padding {}, batch {}", g.channels, g.out_channels, g.size,
                     g.padding, batch);
}

// A module computing conv2d(x, w, b, stride, padding) of `g`, fp32, in eval mode, not frozen.
jit::Module convolution(const Geometry& g, int64_t kernel = 3, int64_t stride = 1, int64_t groups = 1) {
  jit::Module module("__torch__.Convolution");
  module.register_parameter("w", torch::randn({g.out_channels, g.channels / groups, kernel, kernel}) *
                                     std::sqrt(2.0 / (g.channels * kernel * kernel)),
                            false);
  module.register_parameter("b", torch::randn({g.out_channels}) * 0.1, false);
  module.define(fmt::format("def forward(self, x):\n    return torch.conv2d(x, self.w, {}, [{}, {}], [{}, {}], [1, 1], {})\n",
                            g.bias ? "self.b" : "None", stride, stride, g.padding, g.padding, groups));
  module.eval();
  return module;
}

torch::Tensor reference(const jit::Module& module, const torch::Tensor& x, const Geometry& g) {
  const auto w = module.attr("w").toTensor().to(torch::kDouble);
  const c10::optional<torch::Tensor> b =
      g.bias ? c10::optional<torch::Tensor>(module.attr("b").toTensor().to(torch::kDouble)) : c10::nullopt;
  return torch::conv2d(x.to(torch::kDouble), w, b, 1, g.padding);
}

torch::Tensor answer(jit::Module& module, const torch::Tensor& x) {
  const torch::NoGradGuard no_grad;
  return module.forward({x}).toTensor();
}

// Winograd's transforms add roundings of their own: measured up to 2.3e-6 of the outputs' scale
// over these geometries (the direct convolution's up to 3e-7), so bounded at 32 fp32 epsilons.
constexpr double kWinogradError = 32 * std::numeric_limits<float>::epsilon();

double error_to_scale(const torch::Tensor& y, const torch::Tensor& exact) {
  return ((y.to(torch::kDouble) - exact).abs().max() / exact.abs().max()).item<double>();
}

// ResNet-18's four 3x3 stages, DenseNet's growth convolution at two sizes, no padding, 16 channels.
const std::vector<Geometry> kGeometries{{64, 56, 64, 1, true},  {128, 28, 128, 1, true}, {256, 14, 256, 1, false},
                                        {512, 7, 512, 1, true}, {128, 56, 32, 1, false}, {128, 28, 32, 1, true},
                                        {64, 30, 64, 0, true},  {16, 64, 16, 1, true}};

TEST(WinogradConv, WithinTheDirectConvolutionsErrorTwiceTheSame) {
  int winograd_calls = 0;
  for (const Geometry& g : kGeometries) {
    torch::manual_seed(g.channels + g.size);
    jit::Module module = convolution(g);
    jit::Module frozen = jit::freeze(module);
    jit::Module direct = jit::optimize_for_inference(frozen), prepared = prepare_for_inference(frozen);
    ASSERT_TRUE(testing::graph_has(prepared, "afterburner::conv2d_winograd"));
    for (const int64_t batch : {1, 2, 7, 8}) {
      SCOPED_TRACE(describe(g, batch));
      const torch::Tensor x = torch::randn({batch, g.channels, g.size, g.size}).relu();
      const torch::Tensor before = x.clone();
      const torch::Tensor exact = reference(module, x, g);
      const torch::Tensor first = answer(prepared, x), second = answer(prepared, x), theirs = answer(direct, x);
      EXPECT_TRUE(BitwiseEqual(second, first)) << "a second call answered otherwise";
      EXPECT_TRUE(BitwiseEqual(x, before)) << "the input changed";
      EXPECT_EQ(first.sizes(), exact.sizes());
      const double ours = error_to_scale(first, exact), direct_error = error_to_scale(theirs, exact);
      EXPECT_LE(ours, kWinogradError) << "direct " << direct_error << ", Winograd " << ours;
      const int64_t pixels = g.size + 2 * g.padding - 2;
      winograd_calls += winograd_pays(batch, pixels, pixels, g.channels, g.out_channels);
      if (!winograd_pays(batch, pixels, pixels, g.channels, g.out_channels)) {
        EXPECT_TRUE(BitwiseEqual(first, theirs)) << "where Winograd does not pay, LibTorch's convolution";
      }
    }
  }
  EXPECT_GT(winograd_calls, 20) << "the geometries should mostly reach Winograd";
}

// A NaN or an infinity spreads over Winograd's tiles differently from the direct sums (and
// inf - inf makes NaN): such images are answered by LibTorch's direct convolution, bit for bit,
// NaN where it puts NaN; the finite image of the same batch alone still by Winograd.
TEST(WinogradConv, NonFiniteImagesGetLibTorchsAnswer) {
  const Geometry g{64, 56, 64, 1, true};
  torch::manual_seed(3);
  jit::Module frozen = jit::freeze(convolution(g));
  jit::Module direct = jit::optimize_for_inference(frozen), prepared = prepare_for_inference(frozen);
  for (const int64_t position : {0, 1000, 64 * 56 * 56 - 1}) {
    SCOPED_TRACE(fmt::format("non-finite value at {}", position));
    const torch::Tensor x = testing::images_with_non_finite({g.channels, g.size, g.size}, position);
    ASSERT_TRUE(winograd_pays(4, 56, 56, 64, 64));
    const torch::Tensor ours = answer(prepared, x), theirs = answer(direct, x);
    EXPECT_TRUE(BitwiseEqual(ours, theirs));
    EXPECT_TRUE(ours.isnan().any().item<bool>());
    const torch::Tensor finite = x.slice(0, 3);
    EXPECT_FALSE(BitwiseEqual(answer(prepared, finite), answer(direct, finite)))
        << "the finite image alone should be Winograd's (rounded otherwise)";
  }
}

// More image sizes than the transforms kept per convolution (a server's batches vary): each
// still Winograd's answer, the same at a second call.
TEST(WinogradConv, ImagesOfManySizes) {
  const Geometry g{32, 40, 48, 1, true};
  torch::manual_seed(4);
  jit::Module module = convolution(g);
  jit::Module frozen = jit::freeze(module);
  jit::Module direct = jit::optimize_for_inference(frozen), prepared = prepare_for_inference(frozen);
  for (const int64_t size : {40, 64, 33, 100, 48, 72, 40}) {
    for (const int64_t batch : {1, 8}) {
      SCOPED_TRACE(fmt::format("{} px, batch {}", size, batch));
      const torch::Tensor x = torch::randn({batch, g.channels, size, size});
      const torch::Tensor first = answer(prepared, x);
      EXPECT_TRUE(BitwiseEqual(answer(prepared, x), first));
      const torch::Tensor exact = torch::conv2d(x.to(torch::kDouble), module.attr("w").toTensor().to(torch::kDouble),
                                                module.attr("b").toTensor().to(torch::kDouble), 1, 1);
      EXPECT_LE(error_to_scale(first, exact), kWinogradError);
    }
  }
}

TEST(WinogradConv, LeavesOtherConvolutionsToLibTorch) {
  torch::manual_seed(5);
  struct Other {
    const char* name;
    Geometry geometry;
    int64_t kernel, stride, groups;
  };
  for (const Other& other : {Other{"stride 2", {64, 28, 64, 1, true}, 3, 2, 1},
                             Other{"5x5", {64, 28, 64, 2, true}, 5, 1, 1},
                             Other{"padding 2", {64, 28, 64, 2, true}, 3, 1, 1},
                             Other{"grouped", {64, 28, 64, 1, true}, 3, 1, 2},
                             Other{"24 channels in", {24, 28, 64, 1, true}, 3, 1, 1},
                             Other{"40 channels out", {64, 28, 40, 1, true}, 3, 1, 1}}) {
    SCOPED_TRACE(other.name);
    jit::Module frozen = jit::freeze(convolution(other.geometry, other.kernel, other.stride, other.groups));
    jit::Module prepared = jit::optimize_for_inference(frozen);
    auto graph = prepared.get_method("forward").graph();
    EXPECT_EQ(convolve_3x3_by_winograd(graph), 0);
    EXPECT_TRUE(testing::graph_has(prepared, "prim::mkldnn_convolution"));
  }
}

}  // namespace
}  // namespace afterburner::infer::winograd_test
