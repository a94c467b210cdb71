// propagate_non_finite_as_aten, as prepare_for_inference runs it: for every op that
// torch::jit::optimize_for_inference puts on oneDNN's layout between two convolutions, the
// prepared model answers images holding NaN, +inf or -inf, and finite ones, as LibTorch's own
// ops do (the module as scripted, run by the TorchScript interpreter). Channel counts 6 (oneDNN
// pads them to a block of 8 or 16) and 16 (no padding).
#include "afterburner/infer/non_finite.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/script.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/infer/optimize.h"
#include "non_finite.h"
#include "test_models.h"

namespace afterburner::testing {
namespace {
namespace jit = torch::jit;

struct BetweenConvolutions {
  std::string name;
  std::string expression;  // TorchScript of `y`, the first convolution's output
};

void PrintTo(const BetweenConvolutions& c, std::ostream* out) { *out << c.name; }

// x [N, 3, 8, 8] -> conv3x3 -> `op` -> conv3x3 (the second convolution reads every channel the
// op leaves, padding channels included), weights drawn from seed 0; parameters for the ops that
// take some (prelu's weight, BatchNorm's statistics, LayerNorm's affine).
jit::Module model_with(const std::string& expression, int64_t channels) {
  torch::manual_seed(0);
  jit::Module module("__torch__.Between");
  module.register_parameter("w1", torch::randn({channels, 3, 3, 3}) * 0.3, false);
  module.register_parameter("b1", torch::randn({channels}) * 0.1, false);
  module.register_parameter("w2", torch::randn({4, channels, 3, 3}) * 0.3, false);
  module.register_parameter("b2", torch::randn({4}) * 0.1, false);
  module.register_parameter("slope", torch::rand({channels}) * 0.3, false);
  module.register_buffer("mean", torch::randn({channels}) * 0.1);
  module.register_buffer("var", torch::rand({channels}) + 0.5);
  module.register_parameter("gain", torch::rand({channels}) + 0.5, false);
  module.register_parameter("shift", torch::randn({channels}) * 0.1, false);
  module.register_parameter("lgain", torch::rand({8}) + 0.5, false);
  module.register_parameter("lshift", torch::randn({8}) * 0.1, false);
  module.define(fmt::format(
      "def forward(self, x):\n"
      "    y = torch.conv2d(x, self.w1, self.b1, [1, 1], [1, 1], [1, 1], 1)\n"
      "    y = {}\n"
      "    return torch.conv2d(y, self.w2, self.b2, [1, 1], [1, 1], [1, 1], 1)\n",
      expression));
  module.eval();
  return module;
}

std::shared_ptr<jit::Graph> onednn_graph(const std::string& expression, int64_t channels) {
  jit::Module frozen = jit::freeze(model_with(expression, channels));
  return jit::optimize_for_inference(frozen).get_method("forward").graph();
}

class NonFinite : public ::testing::TestWithParam<BetweenConvolutions> {};

TEST_P(NonFinite, PreparedModelAnswersAsLibTorchsOps) {
  for (const int64_t channels : {6, 16}) {
    SCOPED_TRACE(fmt::format("{} channels", channels));
    jit::Module module = model_with(GetParam().expression, channels);
    const torch::Tensor x = images_with_non_finite({3, 8, 8}, 100);
    const torch::Tensor expected = answer(module, x);
    jit::Module frozen = jit::freeze(module);
    jit::Module on_onednn = jit::optimize_for_inference(frozen);
    ASSERT_TRUE(graph_has(on_onednn, "prim::mkldnn_convolution")) << "the case does not reach oneDNN";
    jit::Module prepared = infer::prepare_for_inference(frozen);
    EXPECT_TRUE(AgreesWithNonFinite(answer(prepared, x), expected, 1e-4, 1e-4));
    EXPECT_TRUE(AgreesWithNonFinite(answer(prepared, x.slice(0, 3)), expected.slice(0, 3), 1e-4, 1e-4))
        << "the finite image alone";
  }
}

// Every op optimize_for_inference (LibTorch 1.13) computes on oneDNN tensors.
std::vector<BetweenConvolutions> onednn_ops() {
  return {{"ConvolutionThenConvolution", "y"},
          {"Relu", "torch.relu(y)"},
          {"ReluInPlace", "torch.relu_(y)"},
          {"ReluMaxPool", "torch.max_pool2d(torch.relu(y), [2, 2], [2, 2], [0, 0], [1, 1], False)"},
          {"ReluOverlappingMaxPool", "torch.max_pool2d(torch.relu(y), [3, 3], [2, 2], [1, 1], [1, 1], True)"},
          {"ReluTwoUses", "torch.relu(y) + torch.max_pool2d(torch.relu(y), [3, 3], [1, 1], [1, 1])"},
          {"MaxPool", "torch.max_pool2d(y, [3, 3], [1, 1], [1, 1], [1, 1], False)"},
          {"Sigmoid", "torch.sigmoid(y)"},
          {"Tanh", "torch.tanh(y)"},
          {"Gelu", "torch.gelu(y)"},
          {"Prelu", "torch.prelu(y, self.slope)"},
          {"Hardswish", "torch.hardswish(y)"},
          {"Hardsigmoid", "torch.hardsigmoid(y)"},
          {"Hardtanh", "torch.hardtanh(y, -1.0, 2.0)"},
          {"Relu6", "torch.hardtanh(y, 0.0, 6.0)"},
          {"Clamp", "torch.clamp(y, -1.0, 1.0)"},
          {"Add", "y + torch.tanh(y)"},
          {"Mul", "y * torch.tanh(y)"},
          {"ScalarMul", "y * 0.5"},
          {"AvgPool", "torch.avg_pool2d(y, [2, 2])"},
          {"AdaptiveAvgPool", "torch.adaptive_avg_pool2d(y, [1, 1])"},
          {"BatchNorm", "torch.batch_norm(torch.tanh(y), self.gain, self.shift, self.mean, self.var, False, 0.1, 1e-5, "
                        "False)"},
          {"LayerNorm", "torch.layer_norm(y, [8], self.lgain, self.lshift, 1e-5, False)"}};
}

INSTANTIATE_TEST_SUITE_P(OnOnednn, NonFinite, ::testing::ValuesIn(onednn_ops()),
                         [](const ::testing::TestParamInfo<BetweenConvolutions>& info) { return info.param.name; });

// The kind of node computing the input of the graph's first `kind` node.
const char* input_kind(const jit::Graph& graph, const char* kind) {
  for (const jit::Node* node : graph.nodes()) {
    if (node->kind().toQualString() == std::string(kind)) return node->input(0)->node()->kind().toQualString();
  }
  return "none";
}

// The rewrites themselves: a relu before a max_pool2d fuses with it, other relus become
// hardtanh(x, 0, inf), and hardtanh and the like their ATen ops, all on oneDNN's buffer whether it
// has padding channels or not (6 channels do, 16 do not).
TEST(NonFiniteRewrites, ReluPoolFusesOtherOpsStayOnOnednn) {
  for (const int64_t channels : {6, 16}) {
    for (const char* pool : {"[2, 2], [2, 2]", "[3, 3], [2, 2], [1, 1]"}) {
      SCOPED_TRACE(fmt::format("{} channels, max_pool2d({})", channels, pool));
      jit::Module pooled = jit::freeze(model_with(fmt::format("torch.max_pool2d(torch.relu(y), {})", pool), channels));
      jit::Module prepared = infer::prepare_for_inference(pooled);
      EXPECT_STREQ(input_kind(*prepared.get_method("forward").graph(), "afterburner::relu_max_pool2d"),
                   "prim::mkldnn_convolution");
      EXPECT_FALSE(graph_has(prepared, "aten::relu_"));
      EXPECT_FALSE(graph_has(prepared, "aten::max_pool2d"));
    }
    SCOPED_TRACE(fmt::format("{} channels", channels));
    auto relu = onednn_graph("torch.relu(y)", channels);  // prepare_for_inference then fuses it into the convolution
    EXPECT_EQ(infer::propagate_non_finite_as_aten(relu), 1);
    EXPECT_STREQ(input_kind(*relu, "aten::hardtanh_"), "prim::mkldnn_convolution");
    EXPECT_STREQ(input_kind(*relu, "aten::relu_"), "none");
    auto hardswish = onednn_graph("torch.hardswish(y)", channels);
    EXPECT_EQ(infer::propagate_non_finite_as_aten(hardswish), 1);
    EXPECT_STREQ(input_kind(*hardswish, "aten::hardswish_"), "prim::mkldnn_convolution");
    auto relu6 = onednn_graph("torch.hardtanh(y, 0.0, 6.0)", channels);
    EXPECT_EQ(infer::propagate_non_finite_as_aten(relu6), 1);
  }
  auto tanh = onednn_graph("torch.tanh(y)", 6);
  EXPECT_EQ(infer::propagate_non_finite_as_aten(tanh), 0);
}

}  // namespace
}  // namespace afterburner::testing
