#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "afterburner/kernels/fuse.h"
#include "testing.h"

namespace afterburner::kernels {
namespace nn = torch::nn;
namespace {

// The zoo's cnn, written out here because the kernels tests do not link the models area.
nn::Sequential cnn() {
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::ReLU(),
                        nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)),
                        nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Flatten(), nn::Linear(3136, 128),
                        nn::ReLU(), nn::Linear(128, 10));
}

std::vector<std::string> names(const nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& p : model.named_parameters()) out.push_back(p.key());
  return out;
}

}  // namespace

TEST(Fuse, CnnIsRewrittenOntoFusedOpsKeepingParameterNames) {
  auto model = cnn();
  auto result = fuse(model);
  EXPECT_EQ(result.fused.size(), 3u);  // two ReLU + MaxPool2d, one Linear + ReLU
  EXPECT_TRUE(result.notices.empty());
  EXPECT_EQ(result.model->size(), model->size());
  EXPECT_EQ(names(*result.model), names(*model));
  auto a = model->parameters(), b = result.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].is_same(b[i])) << "parameter " << i << " is not shared";
}

TEST(Fuse, FusedModelComputesTheSameValuesAndGradients) {
  torch::manual_seed(0);
  auto model = cnn();
  auto fused = fuse(model).model;
  auto x = torch::randn({4, 1, 28, 28});
  auto expected = model->forward(x);
  expected.square().sum().backward();
  std::vector<torch::Tensor> expected_grads;
  for (auto& p : model->parameters()) expected_grads.push_back(p.grad().clone());
  model->zero_grad();
  auto actual = fused->forward(x);
  actual.square().sum().backward();
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-5));
  auto params = fused->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), expected_grads[i], 1e-4, 1e-5)) << "parameter " << i;
  }
}

TEST(Fuse, UnsupportedPoolingIsLeftAloneWithANotice) {
  nn::Sequential model(nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions({3, 2}).stride(2)), nn::Flatten());
  auto result = fuse(model);
  EXPECT_TRUE(result.fused.empty());
  ASSERT_EQ(result.notices.size(), 1u);
  EXPECT_TRUE(testing::Contains(result.notices[0], "0-1"));
  EXPECT_TRUE(testing::Contains(result.notices[0], "square"));
  EXPECT_EQ(result.notices[0].find('\n'), std::string::npos);
  auto x = torch::randn({2, 3, 9, 9});
  EXPECT_TRUE(torch::equal(result.model->forward(x), model->forward(x)));
}

// Square windows with any stride, padding, dilation or ceil_mode fuse, as the op takes them.
TEST(Fuse, SquarePoolingWithOtherOptionsFusesToTheSameValues) {
  for (const auto& options : {nn::MaxPool2dOptions(3).stride(2), nn::MaxPool2dOptions(3).stride(1).padding(1),
                              nn::MaxPool2dOptions(2).dilation(2).ceil_mode(true)}) {
    nn::Sequential model{nn::ReLU(), nn::MaxPool2d(options), nn::Flatten()};
    auto result = fuse(model);
    EXPECT_EQ(result.fused.size(), 1u);
    EXPECT_TRUE(result.notices.empty());
    for (int64_t batch : {1, 3}) {
      auto x = torch::randn({batch, 3, 9, 9});
      EXPECT_TRUE(torch::equal(result.model->forward(x), model->forward(x)));
      EXPECT_TRUE(torch::equal(result.model->forward(x), model->forward(x))) << "a second call";
    }
  }
}

// A ReLU between a convolution and a fusable pooling goes with the pooling (pooling first
// leaves a quarter of the values to ReLU); any other Conv2d + ReLU becomes a Conv2dReLU.
TEST(Fuse, ConvReluUnlessTheReluFusesWithAPool) {
  torch::manual_seed(5);
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)), nn::ReLU(),
                       nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(2)));
  auto result = fuse(model);
  ASSERT_EQ(result.fused.size(), 2u);
  EXPECT_EQ(result.fused[0], "layers 0-1: Conv2d + ReLU -> Conv2dReLU");
  EXPECT_EQ(result.fused[1], "layers 3-4: ReLU + MaxPool2d -> ReluMaxPool2d");
  EXPECT_EQ(names(*result.model), names(*model));
  auto x = torch::randn({2, 3, 8, 8});
  EXPECT_TRUE(torch::allclose(result.model->forward(x), model->forward(x), 1e-5, 1e-5));
}

TEST(Fuse, UnsupportedConvIsLeftAloneWithANotice) {
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1).padding_mode(torch::kCircular)), nn::ReLU());
  auto result = fuse(model);
  EXPECT_TRUE(result.fused.empty());
  ASSERT_EQ(result.notices.size(), 1u);
  EXPECT_TRUE(testing::Contains(result.notices[0], "layers 0-1 (Conv2d + ReLU) left unfused: only zero padding"));
  auto x = torch::randn({1, 3, 6, 6});
  EXPECT_TRUE(torch::equal(result.model->forward(x), model->forward(x)));
}

TEST(Fuse, OptionsTurnEachRewriteOff) {
  auto result = fuse(cnn(), FuseOptions().relu_max_pool(false));
  EXPECT_EQ(result.fused.size(), 3u);  // without pooling fusion, each Conv2d + ReLU fuses
  result = fuse(cnn(), FuseOptions().linear_relu(false).relu_max_pool(false));
  EXPECT_EQ(result.fused.size(), 2u);
  result = fuse(cnn(), FuseOptions().linear_relu(false).relu_max_pool(false).conv_relu(false));
  EXPECT_TRUE(result.fused.empty());
}

// A module as Python scripts it: its own forward calling a submodule's, functional ops, and a
// linear whose output is also read elsewhere (so its relu stays).
torch::jit::Module scripted_net() {
  torch::manual_seed(4);
  torch::jit::Module act("Act");
  act.define("def forward(self, x):\n  return torch.relu(x)\n");
  torch::jit::Module net("Net");
  const std::vector<std::pair<const char*, std::vector<int64_t>>> shapes{
      {"w1", {4, 1, 3, 3}}, {"b1", {4}}, {"w2", {6, 4, 3, 3}}, {"b2", {6}}, {"w3", {10, 54}},
      {"b3", {10}},         {"w4", {5, 10}}, {"b4", {5}}, {"w5", {3, 5}}};
  for (const auto& [name, shape] : shapes) {
    net.register_parameter(name, (torch::randn(shape) * 0.3).requires_grad_(), /*is_buffer=*/false);
  }
  net.register_module("act", act);
  net.define(R"(
def forward(self, x):
    x = torch.relu(torch.conv2d(x, self.w1, self.b1, [1, 1], [1, 1], [1, 1], 1))
    x = torch.conv2d(x, self.w2, self.b2, [1, 1], [1, 1], [1, 1], 1)
    x = torch.max_pool2d(torch.relu(x), [2, 2], [2, 2], [0, 0], [1, 1], False)
    x = self.act.forward(torch.linear(torch.flatten(x, 1), self.w3, self.b3))
    h = torch.linear(x, self.w4, self.b4)
    return torch.linear(torch.relu(h), self.w5, None) + h.sum()
)");
  return net;
}

TEST(FuseScript, PatternsAcrossSubmodulesAreFusedAndTheModuleIsLeftAsItWas) {
  torch::jit::Module net = scripted_net();
  const auto result = fuse_forward(net);
  EXPECT_EQ(result.fused, (std::vector<std::string>{"1 x relu + max_pool2d", "1 x conv2d + relu", "1 x linear + relu",
                                                   "1 x conv2d"}));
  ASSERT_EQ(result.notices.size(), 1u);
  EXPECT_EQ(result.notices[0].substr(0, 28), "1 relu(s) left unfused: not ");
  const auto original = net.get_method("forward").graph()->toString();
  EXPECT_EQ(original.find("afterburner::"), std::string::npos) << "the module's own forward was rewritten";

  std::vector<torch::Tensor> parameters;
  for (const auto& p : net.parameters()) parameters.push_back(p);
  for (int call = 0; call < 4; ++call) {  // batch 1 and 3, each called twice
    const torch::Tensor x = torch::randn({call < 2 ? 1 : 3, 1, 6, 6});
    const torch::Tensor expected = net.forward({x}).toTensor();
    const torch::Tensor fused = (*result.forward)({net._ivalue(), x}).toTensor();
    EXPECT_TRUE(torch::allclose(fused, expected, 1e-5, 1e-5)) << "call " << call;
    const auto expected_grads = torch::autograd::grad({expected.sum()}, parameters);
    const auto grads = torch::autograd::grad({fused.sum()}, parameters);
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(torch::allclose(grads[i], expected_grads[i], 1e-4, 1e-5)) << "parameter " << i << ", call " << call;
    }
  }
}

TEST(FuseScript, ACopyRunsTheFusedForwardOverTheSameParameters) {
  torch::jit::Module net = scripted_net();
  FusedScript fused = fuse_script(net);
  EXPECT_EQ(fused.fused, (std::vector<std::string>{"1 x relu + max_pool2d", "1 x conv2d + relu", "1 x linear + relu",
                                                   "1 x conv2d"}));
  EXPECT_EQ(fused.notices.size(), 1u);
  EXPECT_NE(fused.module.get_method("forward").graph()->toString().find("afterburner::conv2d_relu"), std::string::npos);
  EXPECT_EQ(net.get_method("forward").graph()->toString().find("afterburner::"), std::string::npos);
  const auto ours = fused.module.parameters(), theirs = net.parameters();
  ASSERT_EQ(ours.size(), theirs.size());
  for (auto a = ours.begin(), b = theirs.begin(); a != ours.end(); ++a, ++b) EXPECT_TRUE((*a).is_same(*b));
  for (int call = 0; call < 4; ++call) {  // batch 1 and 3, each called twice
    const torch::Tensor x = torch::randn({call < 2 ? 1 : 3, 1, 6, 6});
    EXPECT_TRUE(torch::allclose(fused.module.forward({x}).toTensor(), net.forward({x}).toTensor(), 1e-5, 1e-5))
        << "call " << call;
  }
}

}  // namespace afterburner::kernels

namespace afterburner::kernels {
namespace {

// Under bf16 autocast a LayerNorm read only by Linear layers gives them bf16 (what they would
// cast its fp32 result to); one read by anything else keeps autocast's fp32. The flag is the
// rewritten op's last input.
TEST(FuseScript, LayerNormsReadOnlyByLinearLayersAreMarkedForBf16) {
  torch::jit::Module net("Norms");
  for (const char* name : {"w", "b"}) net.register_parameter(name, torch::randn({8}), false);
  net.register_parameter("lw", torch::randn({8, 8}), false);
  net.define(R"(
def forward(self, x):
    for_linears = torch.layer_norm(x, [8], self.w, self.b, 1e-05, True)
    y = torch.linear(for_linears, self.lw, None) + torch.linear(for_linears, self.lw, None)
    for_others = torch.layer_norm(y, [8], self.w, self.b, 1e-05, True)
    return torch.linear(for_others, self.lw, None) + for_others
)");
  const auto result = fuse_forward(net);
  std::vector<bool> marks;
  for (const torch::jit::Node* node : torch::jit::toGraphFunction(*result.forward).graph()->nodes()) {
    if (node->kind().toQualString() == std::string("afterburner::layer_norm")) {
      marks.push_back(torch::jit::toIValue(node->inputs().back())->toBool());
    }
  }
  EXPECT_EQ(marks, (std::vector<bool>{true, false}));
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({5, 8});
  at::autocast::set_cpu_enabled(true);
  const torch::Tensor fused = (*result.forward)({net._ivalue(), x}).toTensor();
  const torch::Tensor expected = net.forward({x}).toTensor();
  at::autocast::set_cpu_enabled(false);
  EXPECT_EQ(fused.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(torch::allclose(fused, expected, 5e-2, 5e-2));
}

}  // namespace
}  // namespace afterburner::kernels
