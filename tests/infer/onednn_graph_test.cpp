// The oneDNN graph rewrites of prepare_for_inference (infer/onednn_graph.h) on blocks written as
// users write them: a squeeze-and-excitation block (torchvision's SqueezeExcitation: the scale
// from adaptive_avg_pool2d(x, 1) through two 1x1 convolutions, relu and hardsigmoid, times x)
// multiplies on oneDNN's layout and reads sizes without a conversion; silu between convolutions
// runs on oneDNN's layout; a DenseNet layer's first BatchNorm and ReLU go into oneDNN's layout in
// one pass, and a DenseNet block's concatenations into one growing buffer (infer/channel_concat.h);
// ConvNeXt's convolutions between its permutes run on dense channels-last tensors, its blocks'
// layer scale and residual sum in their last Linear layer.
// The prepared models answer as LibTorch's ops, at batch 1, 2 and 7, NaN and infinities included.
#include "afterburner/infer/onednn_graph.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/script.h>

#include <fmt/format.h>

#include <string>
#include <utility>

#include "afterburner/infer/optimize.h"
#include "non_finite.h"
#include "test_models.h"

namespace afterburner::testing {
namespace {
namespace jit = torch::jit;

// x [N, 3, 8, 8] -> conv3x3 -> relu -> squeeze-and-excitation -> conv3x3, `channels` wide in the
// middle (6 and 20 pad oneDNN's channel blocks, 16 does not).
jit::Module squeeze_excitation(int64_t channels) {
  torch::manual_seed(0);
  jit::Module module("__torch__.SqueezeExcitation");
  module.register_parameter("w1", torch::randn({channels, 3, 3, 3}) * 0.3, false);
  module.register_parameter("b1", torch::randn({channels}) * 0.1, false);
  module.register_parameter("fc1", torch::randn({4, channels, 1, 1}) * 0.3, false);
  module.register_parameter("fc1_bias", torch::randn({4}) * 0.1, false);
  module.register_parameter("fc2", torch::randn({channels, 4, 1, 1}) * 0.3, false);
  module.register_parameter("fc2_bias", torch::randn({channels}) * 0.1, false);
  module.register_parameter("w2", torch::randn({5, channels, 3, 3}) * 0.3, false);
  module.define(
      "def forward(self, x):\n"
      "    y = torch.relu(torch.conv2d(x, self.w1, self.b1, [1, 1], [1, 1], [1, 1], 1))\n"
      "    scale = torch.adaptive_avg_pool2d(y, [1, 1])\n"
      "    scale = torch.relu(torch.conv2d(scale, self.fc1, self.fc1_bias, [1, 1], [0, 0], [1, 1], 1))\n"
      "    scale = torch.hardsigmoid(torch.conv2d(scale, self.fc2, self.fc2_bias, [1, 1], [0, 0], [1, 1], 1))\n"
      "    y = scale * y\n"
      "    assert y.size(1) == scale.size(1)\n"
      "    return torch.conv2d(y, self.w2, None, [1, 1], [1, 1], [1, 1], 1)\n");
  module.eval();
  return module;
}

// The prepared model answers [N, 3, 8, 8] images as the module's own ops do, twice: images with
// NaN, +inf, -inf, then finite ones (batch 1 finite, 2 with -inf, 7 all).
void expect_answers_as(jit::Module& module, jit::Module& prepared) {
  const torch::Tensor images = torch::cat({images_with_non_finite({3, 8, 8}, 100), torch::randn({3, 3, 8, 8})});
  for (const int64_t batch : {1, 2, 7}) {
    const torch::Tensor x = images.slice(0, 7 - batch);
    const torch::Tensor expected = answer(module, x);
    EXPECT_TRUE(AgreesWithNonFinite(answer(prepared, x), expected, 1e-4, 1e-4)) << "batch " << batch;
    EXPECT_TRUE(AgreesWithNonFinite(answer(prepared, x), expected, 1e-4, 1e-4)) << "second call, batch " << batch;
  }
}

TEST(OnednnGraph, SqueezeExcitationMultipliesOnOnednnAndAnswersAsLibTorch) {
  for (const int64_t channels : {6, 16, 20}) {
    SCOPED_TRACE(fmt::format("{} channels", channels));
    jit::Module module = squeeze_excitation(channels);
    jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "afterburner::broadcast_mul"), 1);
    EXPECT_EQ(nodes_of_kind(prepared, "prim::BroadcastMKLDNNTensors"), 0);
    // One conversion to dense: the output's. None for the sizes.
    EXPECT_EQ(nodes_of_kind(prepared, "aten::to_dense"), 1);
    expect_answers_as(module, prepared);
  }
}

// conv3x3 -> silu -> conv3x3, as EfficientNet's blocks (20 channels, 4 in the
// squeeze-and-excitation): `body` computes the output from `y`, the first convolution's output.
jit::Module silu_model(const std::string& body) {
  torch::manual_seed(0);
  jit::Module module("__torch__.Silu");
  module.register_parameter("w1", torch::randn({20, 3, 3, 3}) * 0.3, false);
  module.register_parameter("b1", torch::randn({20}) * 0.1, false);
  module.register_parameter("w2", torch::randn({5, 20, 3, 3}) * 0.3, false);
  module.register_parameter("fc1", torch::randn({4, 20, 1, 1}) * 0.3, false);
  module.register_parameter("fc1_bias", torch::randn({4}) * 0.1, false);
  module.register_parameter("fc2", torch::randn({20, 4, 1, 1}) * 0.3, false);
  module.register_parameter("fc2_bias", torch::randn({20}) * 0.1, false);
  module.define(
      "def forward(self, x):\n"
      "    y = torch.conv2d(x, self.w1, self.b1, [1, 1], [1, 1], [1, 1], 1)\n" +
      body);
  module.eval();
  return module;
}

TEST(OnednnGraph, SiluAndSqueezeExcitationRunOnOnednnAndAnswerAsLibTorch) {
  struct Case {
    const char* name;
    const char* body;
    int conversions;  // aten::to_dense left in the prepared graph
    int fused;        // convolutions and the SiLU after them as one oneDNN convolution
  };
  const Case cases[] = {
      {"between convolutions",
       "    return torch.conv2d(torch.silu_(y), self.w2, None, [1, 1], [1, 1], [1, 1], 1)\n", 1, 1},
      {"read densely too",
       "    s = torch.silu(y)\n"
       "    return torch.conv2d(s, self.w2, None, [1, 1], [1, 1], [1, 1], 1) + s.sum()\n", 2, 1},
      // EfficientNet's squeeze-and-excitation: silu, pooling and the product on oneDNN; only the
      // sigmoid (oneDNN's drops NaN) reads a dense copy of its small [N, C, 1, 1] input.
      {"squeeze-and-excitation",
       "    y = torch.silu(y)\n"
       "    scale = torch.adaptive_avg_pool2d(y, [1, 1])\n"
       "    scale = torch.silu(torch.conv2d(scale, self.fc1, self.fc1_bias, [1, 1], [0, 0], [1, 1], 1))\n"
       "    scale = torch.sigmoid(torch.conv2d(scale, self.fc2, self.fc2_bias, [1, 1], [0, 0], [1, 1], 1))\n"
       "    return torch.conv2d(scale * y, self.w2, None, [1, 1], [1, 1], [1, 1], 1)\n", 2, 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    jit::Module module = silu_model(c.body);
    jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "aten::to_dense"), c.conversions);
    EXPECT_EQ(nodes_of_kind(prepared, "afterburner::conv2d_activation"), c.fused);
    EXPECT_EQ(nodes_of_kind(prepared, "aten::silu_"), 0) << "a silu left on a dense copy";
    expect_answers_as(module, prepared);
  }
}

// EfficientNet's residual sum: the block's input, read again after SiLUs LibTorch computes on
// dense copies, went to dense and back to oneDNN's layout for the sum; it is read as it is, the
// answers LibTorch's, NaN and infinities included. Summed into in place, it keeps its copy.
TEST(OnednnGraph, ResidualsSkipTheRoundTripThroughDense) {
  for (const char* sum : {"z + y", "z.add_(y)"}) {
    SCOPED_TRACE(sum);
    torch::manual_seed(0);
    jit::Module module("__torch__.Residual");
    module.register_parameter("w1", torch::randn({16, 3, 3, 3}) * 0.3, false);
    module.register_parameter("w2", torch::randn({16, 16, 3, 3}) * 0.1, false);
    module.register_parameter("w3", torch::randn({16, 16, 1, 1}) * 0.3, false);
    module.define(std::string("def forward(self, x):\n"
                              "    y = torch.conv2d(x, self.w1, None, [1, 1], [1, 1], [1, 1], 1)\n"
                              "    h = torch.silu(torch.conv2d(y, self.w2, None, [1, 1], [1, 1], [1, 1], 1))\n"
                              "    z = torch.conv2d(h, self.w3, None, [1, 1], [0, 0], [1, 1], 1)\n"
                              "    return ") + sum + "\n");
    module.eval();
    jit::Module frozen = jit::freeze(module);
    ASSERT_GE(nodes_of_kind(jit::optimize_for_inference(frozen), "aten::to_mkldnn"), 2) << "LibTorch converts it back";
    jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "aten::to_mkldnn"), 1) << "the input's only";
    expect_answers_as(module, prepared);
  }
}

// The tensor and its copy become one only where neither is written in place.
TEST(OnednnGraph, RoundTripsWrittenInPlaceKeepTheirCopy) {
  for (const auto& [sum, conversions] : {std::pair<const char*, int>{"aten::add(%copy, %x, %one)", 1},
                                         {"aten::add_(%copy, %x, %one)", 2},
                                         {"aten::add_(%x, %copy, %one)", 2}}) {
    SCOPED_TRACE(sum);
    auto graph = std::make_shared<jit::Graph>();
    jit::parseIR(std::string(R"IR(
graph(%input : Tensor):
  %none : NoneType = prim::Constant()
  %one : int = prim::Constant[value=1]()
  %x : Tensor = aten::to_mkldnn(%input, %none)
  %dense : Tensor = aten::to_dense(%x, %none)
  %copy : Tensor = aten::to_mkldnn(%dense, %none)
  %sum : Tensor = )IR") + sum + R"IR(
  return (%sum))IR",
                 graph.get());
    infer::move_onto_onednn(graph);
    int found = 0;
    for (const jit::Node* node : graph->nodes()) {
      found += node->kind() == c10::Symbol::fromQualString("aten::to_mkldnn");
    }
    EXPECT_EQ(found, conversions);
  }
}

// A DenseNet layer as torchvision writes it: BatchNorm and ReLU on the concatenation of the
// features so far, a 1x1 convolution, BatchNorm and ReLU, a 3x3 convolution, its output joining the
// features (16 and 20 channels in: 20 pads oneDNN's blocks). The first BatchNorm's ReLU goes into
// oneDNN's layout in one op; answers as LibTorch's, NaN and infinities included.
jit::Module dense_layer(int64_t channels) {
  torch::manual_seed(0);
  jit::Module module("__torch__.DenseLayer");
  module.register_parameter("w0", torch::randn({channels, 3, 3, 3}) * 0.3, false);
  module.register_parameter("w1", torch::randn({32, channels + 3, 1, 1}) * 0.3, false);
  module.register_parameter("w2", torch::randn({16, 32, 3, 3}) * 0.1, false);
  for (const auto& [name, width] : {std::pair<const char*, int64_t>{"n1", channels + 3}, {"n2", 32}}) {
    module.register_parameter(std::string(name) + "_weight", torch::rand({width}) + 0.5, false);
    module.register_parameter(std::string(name) + "_bias", torch::randn({width}) * 0.1, false);
    module.register_buffer(std::string(name) + "_mean", torch::randn({width}) * 0.1);
    module.register_buffer(std::string(name) + "_var", torch::rand({width}) + 0.5);
  }
  module.define(
      "def forward(self, x):\n"
      "    features = [x, torch.conv2d(x, self.w0, None, [1, 1], [1, 1], [1, 1], 1)]\n"
      "    y = torch.cat(features, 1)\n"
      "    y = torch.relu(torch.batch_norm(y, self.n1_weight, self.n1_bias, self.n1_mean, self.n1_var, False, 0.1, "
      "1e-5, False))\n"
      "    y = torch.conv2d(y, self.w1, None, [1, 1], [0, 0], [1, 1], 1)\n"
      "    y = torch.relu(torch.batch_norm(y, self.n2_weight, self.n2_bias, self.n2_mean, self.n2_var, False, 0.1, "
      "1e-5, False))\n"
      "    return torch.conv2d(y, self.w2, None, [1, 1], [1, 1], [1, 1], 1)\n");
  module.eval();
  return module;
}

TEST(OnednnGraph, DenseNetLayersBatchNormReluGoesIntoOnednnInOnePass) {
  for (const int64_t channels : {13, 17}) {
    SCOPED_TRACE(fmt::format("{} channels", channels + 3));
    jit::Module module = dense_layer(channels);
    jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "afterburner::scale_shift_relu_to_onednn"), 1);
    EXPECT_EQ(nodes_of_kind(prepared, "aten::batch_norm"), 0) << "the second BatchNorm folds into its convolution";
    for (const torch::jit::Node* node : prepared.get_method("forward").graph()->nodes()) {
      if (node->kind().toQualString() != std::string("afterburner::conv2d_activation")) continue;
      EXPECT_EQ(node->input(9)->node()->kind().toQualString(), std::string("afterburner::scale_shift_relu_to_onednn"))
          << "the 1x1 convolution and its ReLU take the bound the BatchNorm and ReLU before returned";
    }
    expect_answers_as(module, prepared);
  }
}

// A DenseNet block as torchvision writes it: the features in a list, each layer reading
// torch.cat(features, 1) through BatchNorm and ReLU, its 8 new channels appended (16, 24 and 32
// channels in), the block's output the concatenation of all. One buffer holds them all.
jit::Module dense_block() {
  torch::manual_seed(0);
  jit::Module module("__torch__.DenseBlock");
  module.register_parameter("w0", torch::randn({16, 3, 3, 3}) * 0.3, false);
  std::string body =
      "def forward(self, x):\n"
      "    features = [torch.conv2d(x, self.w0, None, [1, 1], [1, 1], [1, 1], 1)]\n";
  for (int layer = 0; layer < 3; ++layer) {
    const int64_t width = 16 + 8 * layer;
    module.register_parameter(fmt::format("w{}", layer + 1), torch::randn({8, width, 3, 3}) * 0.2, false);
    module.register_parameter(fmt::format("n{}_weight", layer), torch::rand({width}) + 0.5, false);
    module.register_parameter(fmt::format("n{}_bias", layer), torch::randn({width}) * 0.1, false);
    module.register_buffer(fmt::format("n{}_mean", layer), torch::randn({width}) * 0.1);
    module.register_buffer(fmt::format("n{}_var", layer), torch::rand({width}) + 0.5);
    body += fmt::format(
        "    y = torch.relu(torch.batch_norm(torch.cat(features, 1), self.n{0}_weight, self.n{0}_bias, self.n{0}_mean, "
        "self.n{0}_var, False, 0.1, 1e-5, False))\n"
        "    features.append(torch.conv2d(y, self.w{1}, None, [1, 1], [1, 1], [1, 1], 1))\n",
        layer, layer + 1);
  }
  module.define(body + "    return torch.cat(features, 1)\n");
  module.eval();
  return module;
}

TEST(OnednnGraph, DenseNetBlocksConcatenateIntoOneGrowingBuffer) {
  jit::Module module = dense_block();
  jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
  EXPECT_EQ(nodes_of_kind(prepared, "aten::cat"), 0);
  EXPECT_EQ(nodes_of_kind(prepared, "afterburner::concat_reserve"), 1);
  EXPECT_EQ(nodes_of_kind(prepared, "afterburner::concat_append"), 3);
  for (const torch::jit::Node* node : prepared.get_method("forward").graph()->nodes()) {
    if (node->kind().toQualString() == std::string("afterburner::concat_reserve")) {
      EXPECT_EQ(torch::jit::toIValue(node->input(1))->toInt(), 3 * 8) << "room for the three layers' features";
    }
  }
  EXPECT_EQ(nodes_of_kind(prepared, "afterburner::scale_shift_relu_to_onednn"), 3) << "reads the buffer's slices";
  expect_answers_as(module, prepared);
}

// bf16 graphs append channels-last features, whose layout torch.cat keeps for the convolutions
// reading them: those concatenations stay LibTorch's.
TEST(OnednnGraph, Bf16DenseNetBlocksKeepTorchCat) {
  jit::Module module = dense_block();
  auto optimized = infer::optimize(module, infer::OptimizeOptions().precision(infer::Precision::bf16)).model;
  jit::Module prepared = infer::prepare_for_inference(optimized);
  EXPECT_EQ(nodes_of_kind(prepared, "afterburner::concat_reserve"), 0);
  EXPECT_EQ(nodes_of_kind(prepared, "aten::cat"), 4);
}

// ConvNeXt's stage as torchvision writes it: LayerNorm over the channels between permutes (its
// LayerNorm2d), a strided convolution down to 16 channels, then a block: depthwise 7x7
// convolution, permute to channels-last, LayerNorm, Linear, GELU, Linear, permute back, layer scale,
// residual sum. `tail` ends the block from `h` (the second Linear's output, channels-last) and `y`
// (the block's input).
jit::Module convnext_stage(const std::string& tail) {
  torch::manual_seed(0);
  jit::Module module("__torch__.ConvNeXtStage");
  module.register_parameter("ln0_weight", torch::rand({3}) + 0.5, false);
  module.register_parameter("ln0_bias", torch::randn({3}) * 0.1, false);
  module.register_parameter("down", torch::randn({16, 3, 2, 2}) * 0.3, false);
  module.register_parameter("down_bias", torch::randn({16}) * 0.1, false);
  module.register_parameter("dw", torch::randn({16, 1, 7, 7}) * 0.2, false);
  module.register_parameter("dw_bias", torch::randn({16}) * 0.1, false);
  module.register_parameter("ln_weight", torch::rand({16}) + 0.5, false);
  module.register_parameter("ln_bias", torch::randn({16}) * 0.1, false);
  module.register_parameter("fc1", torch::randn({64, 16}) * 0.3, false);
  module.register_parameter("fc1_bias", torch::randn({64}) * 0.1, false);
  module.register_parameter("fc2", torch::randn({16, 64}) * 0.2, false);
  module.register_parameter("fc2_bias", torch::randn({16}) * 0.1, false);
  module.register_parameter("gamma", torch::rand({16, 1, 1}) + 0.5, false);
  module.define(
      "def forward(self, x):\n"
      "    x = torch.layer_norm(x.permute(0, 2, 3, 1), [3], self.ln0_weight, self.ln0_bias, 1e-6).permute(0, 3, 1, 2)\n"
      "    y = torch.conv2d(x, self.down, self.down_bias, [2, 2], [0, 0], [1, 1], 1)\n"
      "    h = torch.conv2d(y, self.dw, self.dw_bias, [1, 1], [3, 3], [1, 1], 16).permute(0, 2, 3, 1)\n"
      "    h = torch.layer_norm(h, [16], self.ln_weight, self.ln_bias, 1e-6)\n"
      "    h = torch.linear(torch.gelu(torch.linear(h, self.fc1, self.fc1_bias)), self.fc2, self.fc2_bias)\n" +
      tail);
  module.eval();
  return module;
}

// The two convolutions run as LibTorch's dense aten::conv2d, no conversion to oneDNN's layout and
// back left, and the block's layer scale and residual sum go into its second Linear layer
// (afterburner::linear_add_permuted), in either operand order; the answers LibTorch's, NaN and
// infinities included. A residual laid out in NCHW (y.contiguous()) takes the op's other path.
TEST(OnednnGraph, ConvNeXtConvolutionsRunDenselyBetweenItsPermutes) {
  for (const char* tail : {"    return y + self.gamma * h.permute(0, 3, 1, 2)\n",
                           "    return h.permute(0, 3, 1, 2) * self.gamma + y\n",
                           "    return y.contiguous() + self.gamma * h.permute(0, 3, 1, 2)\n"}) {
    SCOPED_TRACE(tail);
    jit::Module module = convnext_stage(tail);
    jit::Module frozen = jit::freeze(module);
    ASSERT_EQ(nodes_of_kind(jit::optimize_for_inference(frozen), "prim::mkldnn_convolution"), 2)
        << "LibTorch lays them out on oneDNN";
    jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "aten::conv2d"), 2);
    EXPECT_EQ(nodes_of_kind(prepared, "prim::mkldnn_convolution"), 0);
    EXPECT_EQ(nodes_of_kind(prepared, "aten::to_mkldnn"), 0);
    EXPECT_EQ(nodes_of_kind(prepared, "aten::to_dense"), 0);
    EXPECT_EQ(nodes_of_kind(prepared, "afterburner::linear_add_permuted"), 1);
    EXPECT_EQ(nodes_of_kind(prepared, "aten::mul"), 0);
    EXPECT_EQ(nodes_of_kind(prepared, "aten::add"), 0);
    expect_answers_as(module, prepared);
  }
}

// A layer scale summed with a number, not a residual tensor, stays as the graph has it.
TEST(OnednnGraph, LayerScalesPlusANumberStayApart) {
  jit::Module module = convnext_stage("    return self.gamma * h.permute(0, 3, 1, 2) + 1.0\n");
  jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
  EXPECT_EQ(nodes_of_kind(prepared, "afterburner::linear_add_permuted"), 0);
  expect_answers_as(module, prepared);
}

// They stay on oneDNN where no reader permutes a result to channels-last, and where a result's
// dense copy is written in place (the rewrite hands every reader the convolution's own result).
TEST(OnednnGraph, ConvolutionsStayOnOnednnWhereNotPermutedOrWrittenInPlace) {
  for (const char* tail : {"    return y.flatten(1)\n",
                           "    z = y.permute(0, 2, 3, 1)\n"
                           "    y.add_(1.0)\n"
                           "    return y + z.permute(0, 3, 1, 2) + h.permute(0, 3, 1, 2)\n"}) {
    SCOPED_TRACE(tail);
    jit::Module module = convnext_stage(tail);
    jit::Module prepared = infer::prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "aten::conv2d"), 0);
    expect_answers_as(module, prepared);
  }
}

}  // namespace
}  // namespace afterburner::testing
