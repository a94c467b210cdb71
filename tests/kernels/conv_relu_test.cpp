#include "afterburner/kernels/conv_relu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "autograd_check.h"
#include "testing.h"

namespace {

namespace nn = torch::nn;
using afterburner::kernels::Conv2dReLU;
using afterburner::kernels::Conv2dReLUImpl;
using afterburner::kernels::Conv2dReLUOptions;
using afterburner::testing::AllClose;

// A Conv2d and the Conv2dReLU over its own tensors, in `dtype`, with an input requiring grad.
struct Case {
  nn::Conv2d conv;
  Conv2dReLU fused;
  torch::Tensor x;
};

Case make_case(const Conv2dReLUOptions& options, std::vector<int64_t> x_shape, torch::Dtype dtype) {
  torch::manual_seed(21);
  nn::Conv2d conv(options);
  conv->to(dtype);
  return {conv, Conv2dReLUImpl::from_conv(conv), torch::randn(x_shape, torch::dtype(dtype).requires_grad(true))};
}

// Output and the gradients of input, weight and bias against relu(Conv2d(x)), LibTorch's two
// unfused ops, for the same upstream gradient. With `autocast` the forward passes run under bf16
// autocast and the backward ones after it, as in training.
void expect_matches_unfused(Case c, double tolerance, bool autocast = false) {
  torch::Tensor fused, expected;
  {
    std::optional<afterburner::testing::BFloat16Autocast> scope;
    if (autocast) scope.emplace();
    fused = c.fused->forward(c.x);
    expected = torch::relu(c.conv->forward(c.x));
  }
  ASSERT_EQ(fused.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(AllClose(fused, expected, tolerance, tolerance));
  std::vector<torch::Tensor> inputs{c.x, c.conv->weight};
  if (c.conv->bias.defined()) inputs.push_back(c.conv->bias);
  const torch::Tensor upstream = torch::randn_like(expected);
  const auto fused_grads = torch::autograd::grad({fused}, inputs, {upstream});
  const auto expected_grads = torch::autograd::grad({expected}, inputs, {upstream});
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(fused_grads[i].scalar_type(), inputs[i].scalar_type()) << "gradient " << i;
    EXPECT_TRUE(AllClose(fused_grads[i], expected_grads[i], tolerance, tolerance)) << "gradient " << i;
  }
}

TEST(Conv2dReLU, MatchesConvThenReluInDouble) {
  expect_matches_unfused(make_case(Conv2dReLUOptions(3, 5, 3).padding(1), {2, 3, 9, 9}, torch::kDouble), 1e-10);
}

TEST(Conv2dReLU, StridesDilationGroupsAndNoBias) {
  expect_matches_unfused(make_case(Conv2dReLUOptions(4, 6, {3, 2}).stride({2, 1}).padding({1, 0}).dilation(2).groups(2).bias(false),
                                   {2, 4, 11, 10}, torch::kDouble),
                         1e-10);
}

TEST(Conv2dReLU, ValidPaddingAndUnbatchedInput) {
  Case c = make_case(Conv2dReLUOptions(2, 3, 3).padding(torch::kValid), {2, 7, 7}, torch::kDouble);
  EXPECT_EQ(c.fused->forward(c.x).sizes(), (std::vector<int64_t>{3, 5, 5}));
  expect_matches_unfused(c, 1e-10);
}

TEST(Conv2dReLU, MatchesConvThenReluInFloatAndChannelsLast) {
  Case c = make_case(Conv2dReLUOptions(8, 16, 3).padding(1), {4, 8, 12, 12}, torch::kFloat);
  expect_matches_unfused(c, 1e-4);
  c.x = c.x.detach().contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_();
  expect_matches_unfused(c, 1e-4);
}

TEST(Conv2dReLU, FiniteDifferences) {
  Case c = make_case(Conv2dReLUOptions(2, 3, 3).padding(1).stride(2), {2, 2, 5, 5}, torch::kDouble);
  const torch::Tensor upstream = torch::randn({2, 3, 3, 3}, torch::kDouble);
  afterburner::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>&) { return (c.fused->forward(c.x) * upstream).sum(); },
      {c.x, c.conv->weight, c.conv->bias});
}

TEST(Conv2dReLU, InputWithoutGradientGetsNone) {
  Case c = make_case(Conv2dReLUOptions(3, 4, 3), {2, 3, 6, 6}, torch::kDouble);
  c.x = c.x.detach();
  c.fused->forward(c.x).sum().backward();
  EXPECT_FALSE(c.x.grad().defined());
  EXPECT_TRUE(c.conv->weight.grad().defined());
  EXPECT_TRUE(c.conv->bias.grad().defined());
}

// Under autocast the convolution runs in bf16 like torch::conv2d's: a bf16 output and gradients
// that come back to the fp32 tensors in fp32.
TEST(Conv2dReLU, AutocastBFloat16LikeTorchConv2d) {
  Case c = make_case(Conv2dReLUOptions(4, 8, 3).padding(1), {2, 4, 8, 8}, torch::kFloat);
  {
    afterburner::testing::BFloat16Autocast autocast;
    EXPECT_EQ(c.fused->forward(c.x).scalar_type(), torch::kBFloat16);
  }
  expect_matches_unfused(c, 2e-2, true);
}

TEST(Conv2dReLUModule, DefaultInitializationMatchesConv2d) {
  torch::manual_seed(3);
  nn::Conv2d conv(Conv2dReLUOptions(3, 4, 3));
  torch::manual_seed(3);
  Conv2dReLU fused(Conv2dReLUOptions(3, 4, 3));
  EXPECT_TRUE(torch::equal(fused->weight, conv->weight));
  EXPECT_TRUE(torch::equal(fused->bias, conv->bias));
  EXPECT_EQ(fused->named_parameters().keys(), (std::vector<std::string>{"weight", "bias"}));
}

TEST(Conv2dReLUModule, FromConvSharesParameters) {
  nn::Conv2d conv(Conv2dReLUOptions(3, 4, 3));
  Conv2dReLU fused = Conv2dReLUImpl::from_conv(conv);
  EXPECT_TRUE(fused->weight.is_same(conv->weight));
  EXPECT_TRUE(fused->bias.is_same(conv->bias));
  fused(torch::randn({1, 3, 5, 5})).sum().backward();
  EXPECT_TRUE(conv->weight.grad().defined());
}

TEST(Conv2dReLUModule, UnsupportedOptionsAreRefusedByName) {
  using afterburner::testing::Contains;
  using afterburner::testing::error_message;
  nn::Conv2d reflect(Conv2dReLUOptions(3, 4, 3).padding(1).padding_mode(torch::kReflect));
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { Conv2dReLUImpl::from_conv(reflect); }),
                       "Conv2dReLU: only zero padding is supported"));
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { Conv2dReLU(Conv2dReLUOptions(3, 4, 3).padding(torch::kSame)); }),
                       "Conv2dReLU: padding \"same\" is not supported"));
}

}  // namespace
