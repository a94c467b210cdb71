// fuse_activations_into_convolutions and afterburner::conv2d_activation, as prepare_for_inference
// runs them: over the activations it fuses (ReLU in place or not, ReLU6, hardtanh, clamp,
// Hardswish, SiLU, GELU) and the convolutions MobileNets, EfficientNets and ResNets carry
// (pointwise, depthwise, strided, grouped, Winograd's 3x3, no bias), at batch 1, 2, 7 and 8, the
// prepared model is within 32 fp32 epsilons of the outputs' scale of the double-precision answer,
// twice the same, its input left alone. Where the sums could hold NaN or an infinity (the input
// holds one, or values so large a sum could overflow), and where reading the input would cost more
// than the activation's own pass, it gives the unfused graph's answer, bit for bit; the finite
// image of the same batch alone still gets oneDNN's post-op. A chain of fused convolutions passes
// the bound of its values along. Activations oneDNN's post-op would change the padding channels of,
// and convolutions whose output something else reads, stay unfused. ResNet's residual sum and ReLU
// after a Winograd convolution take one pass, with the bounds the convolutions before returned.
#include "afterburner/infer/conv_activation.h"

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

namespace afterburner::infer::conv_activation_test {
namespace {
namespace jit = torch::jit;
using testing::answer;
using testing::BitwiseEqual;
using testing::nodes_of_kind;

struct Geometry {
  const char* name;
  int64_t channels, size, out_channels, kernel, stride, groups;
  bool bias;
};

// conv2d(x, w, b) of `g` ("same" padding), then `activation` of its output `y`, fp32, eval, not frozen.
jit::Module convolution(const Geometry& g, const std::string& activation) {
  jit::Module module("__torch__.ConvActivation");
  module.register_parameter("w", torch::randn({g.out_channels, g.channels / g.groups, g.kernel, g.kernel}) *
                                     std::sqrt(2.0 / (g.channels / g.groups * g.kernel * g.kernel)),
                            false);
  module.register_parameter("b", torch::randn({g.out_channels}) * 0.1, false);
  module.define(fmt::format("def forward(self, x):\n"
                            "    y = torch.conv2d(x, self.w, {}, [{}, {}], [{}, {}], [1, 1], {})\n"
                            "    return {}\n",
                            g.bias ? "self.b" : "None", g.stride, g.stride, g.kernel / 2, g.kernel / 2, g.groups,
                            activation));
  module.eval();
  return module;
}

// The largest error of y against its double-precision answer, to `scale`.
double error_to_scale(const torch::Tensor& y, const torch::Tensor& reference, double scale) {
  return (y.to(torch::kDouble) - reference).abs().max().item<double>() / scale;
}

// The scale of the convolution's sums (before the activation, which may clip them).
double sums_scale(const jit::Module& module, const torch::Tensor& x, const Geometry& g) {
  const auto w = module.attr("w").toTensor().to(torch::kDouble);
  const c10::optional<torch::Tensor> b =
      g.bias ? c10::optional<torch::Tensor>(module.attr("b").toTensor().to(torch::kDouble)) : c10::nullopt;
  return torch::conv2d(x.to(torch::kDouble), w, b, g.stride, g.kernel / 2, 1, g.groups).abs().max().item<double>();
}

// Winograd's transforms and oneDNN's exp and erf add roundings of their own: bounded as
// winograd_conv_test bounds Winograd's.
constexpr double kError = 32 * std::numeric_limits<float>::epsilon();

const std::vector<std::string> kActivations{
    "torch.relu(y)",  "torch.relu_(y)",      "torch.hardtanh(y, 0.0, 6.0)", "torch.hardtanh(y, -1.0, 2.0)",
    "torch.clamp(y, None, 1.0)", "torch.hardswish(y)", "torch.silu(y)", "torch.gelu(y)"};

// MobileNetV3's and EfficientNet's pointwise and depthwise convolutions (3x3, 5x5 strided over an
// odd size), ResNet's 3x3 (Winograd's from batch 8), a grouped one, a strided one without bias.
const std::vector<Geometry> kGeometries{{"pointwise 16 -> 72", 16, 14, 72, 1, 1, 1, true},
                                        {"depthwise 3x3", 72, 14, 72, 3, 1, 72, true},
                                        {"depthwise 5x5 stride 2", 40, 15, 40, 5, 2, 40, true},
                                        {"3x3 64 -> 64", 64, 28, 64, 3, 1, 1, true},
                                        {"grouped 3x3, no bias", 32, 12, 32, 3, 1, 4, false},
                                        {"3x3 stride 2, no bias", 16, 28, 32, 3, 2, 1, false}};

TEST(ConvActivation, WithinTheConvolutionsErrorTwiceTheSame) {
  for (const Geometry& g : kGeometries) {
    for (const std::string& activation : kActivations) {
      torch::manual_seed(g.channels + g.size);
      jit::Module module = convolution(g, activation);
      jit::Module prepared = prepare_for_inference(jit::freeze(module));
      SCOPED_TRACE(fmt::format("{}, {}", g.name, activation));
      ASSERT_EQ(nodes_of_kind(prepared, "afterburner::conv2d_activation"), 1);
      for (const int64_t batch : {1, 2, 7, 8}) {
        SCOPED_TRACE(fmt::format("batch {}", batch));
        const torch::Tensor x = torch::randn({batch, g.channels, g.size, g.size});
        const torch::Tensor before = x.clone();
        const torch::Tensor first = answer(prepared, x), second = answer(prepared, x);
        EXPECT_TRUE(BitwiseEqual(second, first)) << "a second call answered otherwise";
        EXPECT_TRUE(BitwiseEqual(x, before)) << "the input changed";
        const torch::Tensor reference = testing::exact_answer(module, x);
        ASSERT_EQ(first.sizes(), reference.sizes());
        EXPECT_LE(error_to_scale(first, reference, sums_scale(module, x, g)), kError);
      }
    }
  }
}

// SiLU on oneDNN's post-op rounds otherwise than ATen's: LibTorch's optimize_for_inference, which
// computes ATen's SiLU after oneDNN's convolution, tells the unfused answer from the fused one.
jit::Module libtorchs(const jit::Module& module) {
  jit::Module frozen = jit::freeze(module);
  return jit::optimize_for_inference(frozen);
}

// x with one value of 1e30: the sums reading it are huge, the others as they were (where SiLU's
// rounding tells oneDNN's from ATen's).
torch::Tensor with_one_huge_value(torch::Tensor x) {
  x.view(-1)[x.numel() / 3] = 1e30;
  return x;
}

TEST(ConvActivation, SumsThatMayNotBeFiniteGetTheUnfusedAnswer) {
  const Geometry g{"pointwise 16 -> 48", 16, 10, 48, 1, 1, 1, true};
  torch::manual_seed(3);
  jit::Module module = convolution(g, "torch.silu(y)");
  jit::Module theirs = libtorchs(module), prepared = prepare_for_inference(jit::freeze(module));
  const torch::Tensor images = testing::images_with_non_finite({g.channels, g.size, g.size}, 700);
  SCOPED_TRACE("images with NaN, +inf, -inf and none");
  EXPECT_TRUE(BitwiseEqual(answer(prepared, images), answer(theirs, images)));
  EXPECT_TRUE(testing::AgreesWithNonFinite(answer(prepared, images), answer(module, images), 1e-5, 1e-5));
  const torch::Tensor finite = images.slice(0, 3);
  EXPECT_FALSE(BitwiseEqual(answer(prepared, finite), answer(theirs, finite)))
      << "the finite image alone should be oneDNN's post-op (rounded otherwise)";
  // max|x| * (the largest sum of a row's weight magnitudes) above 2^100: the sums could overflow.
  const torch::Tensor huge = with_one_huge_value(torch::randn({2, g.channels, g.size, g.size}));
  EXPECT_TRUE(BitwiseEqual(answer(prepared, huge), answer(theirs, huge))) << "values near overflow";
}

// A stride-2 depthwise convolution's input is 4 times its output: reading its magnitudes would
// cost more than the activation's own pass, which runs instead (LibTorch's bits); fed by a fused
// convolution, it takes that one's bound instead and is fused.
TEST(ConvActivation, LargeInputsWithoutABoundStayUnfused) {
  const Geometry g{"depthwise 3x3 stride 2", 24, 16, 24, 3, 2, 24, true};
  torch::manual_seed(4);
  jit::Module module = convolution(g, "torch.silu(y)");
  jit::Module theirs = libtorchs(module), prepared = prepare_for_inference(jit::freeze(module));
  ASSERT_EQ(nodes_of_kind(prepared, "afterburner::conv2d_activation"), 1);
  const torch::Tensor x = torch::randn({3, g.channels, g.size, g.size});
  EXPECT_TRUE(BitwiseEqual(answer(prepared, x), answer(theirs, x)));
}

// A pointwise convolution, then a 3x3 depthwise one and its activation, as MobileNets' and
// EfficientNets' blocks: the depthwise one reads the first one's channel-blocked output and runs
// our kernel at stride 1 (kernels/depthwise_conv.h; oneDNN's at stride 2), which answers as
// LibTorch's ops for any input, NaN and infinities included; a second call bit for bit.
TEST(ConvActivation, DepthwiseAfterAConvolutionAnswersAsLibTorch) {
  for (const int64_t stride : {1, 2}) {
    for (const std::string& activation : kActivations) {
      if (activation == "torch.gelu(y)") continue;  // no depthwise layer has it: oneDNN's
      SCOPED_TRACE(fmt::format("stride {}, {}", stride, activation));
      torch::manual_seed(6);
      jit::Module module("__torch__.PointwiseDepthwise");
      module.register_parameter("expand", torch::randn({48, 16, 1, 1}) * 0.35, false);
      module.register_parameter("depthwise", torch::randn({48, 1, 3, 3}) * 0.45, false);
      module.register_parameter("b", torch::randn({48}) * 0.1, false);
      module.define(fmt::format("def forward(self, x):\n"
                                "    h = torch.conv2d(x, self.expand, self.b, [1, 1], [0, 0], [1, 1], 1)\n"
                                "    y = torch.conv2d(h, self.depthwise, self.b, [{0}, {0}], [1, 1], [1, 1], 48)\n"
                                "    return {1}\n",
                                stride, activation));
      module.eval();
      jit::Module prepared = prepare_for_inference(jit::freeze(module));
      const torch::Tensor images = torch::cat({testing::images_with_non_finite({16, 30, 30}, 80),
                                               torch::randn({3, 16, 30, 30})});
      for (const int64_t batch : {1, 2, 7}) {
        const torch::Tensor x = images.slice(0, 7 - batch);
        const torch::Tensor first = answer(prepared, x);
        EXPECT_TRUE(testing::AgreesWithNonFinite(first, answer(module, x), 1e-5, 1e-5)) << "batch " << batch;
        EXPECT_TRUE(BitwiseEqual(answer(prepared, x), first)) << "second call, batch " << batch;
      }
    }
  }
}

// Pointwise expansion, depthwise, projection: EfficientNet's block without its squeeze-excitation
// (a 5x5 depthwise convolution: oneDNN's, as the 3x3 ones are ours, kernels/depthwise_conv.h).
jit::Module expansion_block() {
  torch::manual_seed(5);
  jit::Module module("__torch__.Block");
  module.register_parameter("expand", torch::randn({96, 16, 1, 1}) * 0.35, false);
  module.register_parameter("depthwise", torch::randn({96, 1, 5, 5}) * 0.27, false);
  module.register_parameter("project", torch::randn({24, 96, 1, 1}) * 0.15, false);
  module.register_parameter("b", torch::randn({96}) * 0.1, false);
  module.define(
      "def forward(self, x):\n"
      "    y = torch.silu(torch.conv2d(x, self.expand, self.b, [1, 1], [0, 0], [1, 1], 1))\n"
      "    y = torch.silu(torch.conv2d(y, self.depthwise, self.b, [2, 2], [2, 2], [1, 1], 96))\n"
      "    return torch.conv2d(y, self.project, None, [1, 1], [0, 0], [1, 1], 1)\n");
  module.eval();
  return module;
}

TEST(ConvActivation, AChainPassesItsBoundAlong) {
  jit::Module module = expansion_block();
  jit::Module theirs = libtorchs(module), prepared = prepare_for_inference(jit::freeze(module));
  std::vector<const jit::Node*> fused;
  for (const jit::Node* node : prepared.get_method("forward").graph()->nodes()) {
    if (node->kind().toQualString() == std::string("afterburner::conv2d_activation")) fused.push_back(node);
  }
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(fused[1]->input(9), fused[0]->output(1)) << "the depthwise convolution takes the expansion's bound";
  EXPECT_TRUE(jit::toIValue(fused[0]->input(9)).value().isNone()) << "the first reads its input";
  for (const int64_t batch : {1, 7}) {
    const torch::Tensor x = torch::randn({batch, 16, 14, 14});
    const torch::Tensor first = answer(prepared, x);
    EXPECT_TRUE(BitwiseEqual(answer(prepared, x), first));
    const torch::Tensor reference = testing::exact_answer(module, x);
    EXPECT_LE(error_to_scale(first, reference, reference.abs().max().item<double>()), kError);
    EXPECT_FALSE(BitwiseEqual(first, answer(theirs, x))) << "both fused: rounded otherwise than LibTorch's";
  }
  // A NaN in one image, values near overflow in another: the first convolution unfused, and the
  // second, given no bound, reads its own input.
  const torch::Tensor images = testing::images_with_non_finite({16, 14, 14}, 50);
  EXPECT_TRUE(BitwiseEqual(answer(prepared, images), answer(theirs, images)));
  const torch::Tensor huge = with_one_huge_value(torch::randn({2, 16, 14, 14}));
  EXPECT_TRUE(BitwiseEqual(answer(prepared, huge), answer(theirs, huge)));
}

// A stem convolution and ResNet's basic block after it, 64 channels at 28x28 (Winograd's from
// batch 3): conv-ReLU-conv, then `residual` adds the block's input, then ReLU.
jit::Module basic_block(const std::string& residual) {
  torch::manual_seed(9);
  jit::Module module("__torch__.BasicBlock");
  module.register_parameter("w0", torch::randn({64, 64, 3, 3}) * 0.06, false);
  module.register_parameter("w1", torch::randn({64, 64, 3, 3}) * 0.06, false);
  module.register_parameter("w2", torch::randn({64, 64, 3, 3}) * 0.06, false);
  module.register_parameter("b", torch::randn({64}) * 0.1, false);
  module.define(fmt::format("def forward(self, x):\n"
                            "    x = torch.relu(torch.conv2d(x, self.w0, self.b, [1, 1], [1, 1], [1, 1], 1))\n"
                            "    y = torch.relu(torch.conv2d(x, self.w1, self.b, [1, 1], [1, 1], [1, 1], 1))\n"
                            "    y = torch.conv2d(y, self.w2, self.b, [1, 1], [1, 1], [1, 1], 1)\n"
                            "    {}\n"
                            "    return torch.relu(y)\n",
                            residual));
  module.eval();
  return module;
}

// `out += identity; relu(out)` after a Winograd convolution: the sum and the ReLU in one pass,
// taking the bounds the convolutions before returned; within Winograd's error of the
// double answer at batch 1, 2 (too small for Winograd: the graph's ops), 7 and 8, twice the same,
// input untouched; NaN, infinities and values near overflow answered as the module answers them.
TEST(ConvActivation, ResidualSumsAndReluInOnePass) {
  jit::Module module = basic_block("y += x");
  jit::Module prepared = prepare_for_inference(jit::freeze(module));
  ASSERT_EQ(nodes_of_kind(prepared, "afterburner::conv2d_add_relu"), 1);
  EXPECT_EQ(nodes_of_kind(prepared, "aten::add_"), 0);
  for (const jit::Node* node : prepared.get_method("forward").graph()->nodes()) {
    if (node->kind().toQualString() != std::string("afterburner::conv2d_add_relu")) continue;
    EXPECT_EQ(node->input(10)->node()->kind().toQualString(), std::string("afterburner::conv2d_activation"))
        << "takes the first convolution's bound";
    EXPECT_EQ(node->input(11)->node()->kind().toQualString(), std::string("afterburner::conv2d_activation"))
        << "and the stem's, which made the residual";
  }
  for (const int64_t batch : {1, 2, 7, 8}) {
    SCOPED_TRACE(fmt::format("batch {}", batch));
    const torch::Tensor x = torch::randn({batch, 64, 28, 28});
    const torch::Tensor before = x.clone();
    const torch::Tensor first = answer(prepared, x);
    EXPECT_TRUE(BitwiseEqual(answer(prepared, x), first)) << "a second call answered otherwise";
    EXPECT_TRUE(BitwiseEqual(x, before)) << "the input changed";
    const torch::Tensor reference = testing::exact_answer(module, x);
    EXPECT_LE(error_to_scale(first, reference, reference.abs().max().item<double>()), kError);
  }
  const torch::Tensor images = torch::cat({testing::images_with_non_finite({64, 28, 28}, 900),
                                           with_one_huge_value(torch::randn({4, 64, 28, 28}))});
  EXPECT_TRUE(testing::AgreesWithNonFinite(answer(prepared, images), answer(module, images), 1e-4, 1e-4));
}

TEST(ConvActivation, ResidualSumsWrittenIntoTheResidualStayApart) {
  jit::Module module = basic_block("y = x.add_(y)");  // the sum goes into x's buffer, not y's
  jit::Module prepared = prepare_for_inference(jit::freeze(module));
  EXPECT_EQ(nodes_of_kind(prepared, "afterburner::conv2d_add_relu"), 0);
  const torch::Tensor x = torch::randn({8, 64, 28, 28});
  const torch::Tensor reference = testing::exact_answer(module, x);
  EXPECT_LE(error_to_scale(answer(prepared, x), reference, reference.abs().max().item<double>()), kError);
}

TEST(ConvActivation, LeavesWhatItCannotFuse) {
  const Geometry g{"3x3", 16, 12, 16, 3, 1, 1, true};
  for (const char* other : {"torch.clamp(y, 0.5, 2.0)",                       // clip(0) is not 0: padding channels
                            "torch.hardtanh(y, -2.0, -1.0)", "torch.sigmoid(y)",  // nor here; sigmoid goes dense
                            "torch.relu(y) + y"}) {                              // the sum reads y too
    SCOPED_TRACE(other);
    torch::manual_seed(6);
    jit::Module module = convolution(g, other);
    jit::Module prepared = prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "afterburner::conv2d_activation"), 0);
    const torch::Tensor x = torch::randn({2, g.channels, g.size, g.size});
    EXPECT_LE(error_to_scale(answer(prepared, x), testing::exact_answer(module, x), sums_scale(module, x, g)), kError);
  }
}

}  // namespace
}  // namespace afterburner::infer::conv_activation_test
