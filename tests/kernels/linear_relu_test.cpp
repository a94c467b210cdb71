#include "afterburner/kernels/linear_relu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "autograd_check.h"
#include "testing.h"

namespace {

using afterburner::kernels::linear_relu;
using afterburner::kernels::LinearReLU;
using afterburner::kernels::LinearReLUImpl;
using afterburner::kernels::LinearReLUOptions;
using afterburner::testing::AllClose;
namespace F = torch::nn::functional;

torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return torch::relu(F::linear(x, weight, bias));
}

struct LinearCase {
  torch::Tensor x, weight, bias;
};

LinearCase random_linear_case(std::vector<int64_t> x_shape, int64_t out_features, torch::Dtype dtype, bool with_bias = true) {
  torch::manual_seed(11);
  const auto options = torch::TensorOptions().dtype(dtype).requires_grad(true);
  const int64_t in_features = x_shape.back();
  return {torch::randn(x_shape, options), torch::randn({out_features, in_features}, options),
          with_bias ? torch::randn({out_features}, options) : torch::Tensor()};
}

std::vector<torch::Tensor> requiring_grad(const LinearCase& c) {
  std::vector<torch::Tensor> inputs;
  for (const auto& t : {c.x, c.weight, c.bias}) {
    if (t.defined() && t.requires_grad()) inputs.push_back(t);
  }
  return inputs;
}

// Output and every gradient of linear_relu against relu(linear(...)) for the same upstream grad.
// With `autocast` the forward passes run under bf16 autocast and the backward ones after it, as
// in training.
void expect_matches_reference(const LinearCase& c, double tolerance, bool autocast = false) {
  torch::Tensor fused, expected;
  {
    std::optional<afterburner::testing::BFloat16Autocast> scope;
    if (autocast) scope.emplace();
    fused = linear_relu(c.x, c.weight, c.bias);
    expected = reference(c.x, c.weight, c.bias);
  }
  ASSERT_EQ(fused.scalar_type(), expected.scalar_type());
  EXPECT_TRUE(AllClose(fused, expected, tolerance, tolerance));
  const torch::Tensor upstream = torch::randn_like(expected);
  const auto inputs = requiring_grad(c);
  const auto fused_grads = torch::autograd::grad({fused}, inputs, {upstream});
  const auto expected_grads = torch::autograd::grad({expected}, inputs, {upstream});
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(fused_grads[i].scalar_type(), inputs[i].scalar_type()) << "gradient " << i;
    EXPECT_TRUE(AllClose(fused_grads[i], expected_grads[i], tolerance, tolerance)) << "gradient " << i;
  }
}

TEST(LinearReLU, MatchesLinearThenReluInDouble) { expect_matches_reference(random_linear_case({9, 6}, 5, torch::kDouble), 1e-10); }

TEST(LinearReLU, MatchesLinearThenReluInFloat) { expect_matches_reference(random_linear_case({33, 20}, 17, torch::kFloat), 1e-5); }

TEST(LinearReLU, WithoutBias) { expect_matches_reference(random_linear_case({9, 6}, 5, torch::kDouble, false), 1e-10); }

TEST(LinearReLU, FlattensLeadingDimensions) {
  const LinearCase three_d = random_linear_case({2, 3, 6}, 5, torch::kDouble);
  EXPECT_EQ(linear_relu(three_d.x, three_d.weight, three_d.bias).sizes(), (std::vector<int64_t>{2, 3, 5}));
  expect_matches_reference(three_d, 1e-10);
  const LinearCase one_d = random_linear_case({6}, 5, torch::kDouble);
  EXPECT_EQ(linear_relu(one_d.x, one_d.weight, one_d.bias).sizes(), (std::vector<int64_t>{5}));
  expect_matches_reference(one_d, 1e-10);
}

TEST(LinearReLU, InputWithoutGradientGetsNone) {
  LinearCase c = random_linear_case({9, 6}, 5, torch::kDouble);
  c.x = c.x.detach();
  expect_matches_reference(c, 1e-10);
  linear_relu(c.x, c.weight, c.bias).sum().backward();
  EXPECT_FALSE(c.x.grad().defined());
  EXPECT_TRUE(c.weight.grad().defined());
}

TEST(LinearReLU, OnlyInputRequiringGradient) {
  LinearCase c = random_linear_case({9, 6}, 5, torch::kDouble);
  c.weight = c.weight.detach();
  c.bias = c.bias.detach();
  expect_matches_reference(c, 1e-10);
}

// Pre-activations of exactly 0 (a zero input row meeting zero biases, a zero weight row) must
// get relu's gradient there, 0, not the upstream one.
TEST(LinearReLU, ExactZerosAtTheReluBoundaryGetZeroGradient) {
  LinearCase c = random_linear_case({6, 4}, 5, torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    c.x[2].zero_();
    c.bias.index_put_({torch::indexing::Slice(0, 3)}, 0.0);
    c.weight[4].zero_();
    c.bias[4] = 0.0;
  }
  const torch::Tensor y = linear_relu(c.x, c.weight, c.bias);
  ASSERT_EQ(y.index({2, torch::indexing::Slice(0, 3)}).count_nonzero().item<int64_t>(), 0);
  ASSERT_EQ(y.select(1, 4).count_nonzero().item<int64_t>(), 0);
  expect_matches_reference(c, 1e-12);
  const auto grads = torch::autograd::grad({y}, {c.bias}, {torch::ones_like(y)});
  EXPECT_EQ(grads[0][4].item<double>(), 0.0);
}

TEST(LinearReLU, FiniteDifferences) {
  const LinearCase c = random_linear_case({5, 4}, 3, torch::kDouble);
  const torch::Tensor upstream = torch::randn({5, 3}, torch::kDouble);
  afterburner::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& in) { return (linear_relu(in[0], in[1], in[2]) * upstream).sum(); },
      {c.x, c.weight, c.bias});
}

// Under autocast the GEMM runs in bf16 like torch::linear's: a bf16 output and gradients that
// come back to the fp32 tensors in fp32.
TEST(LinearReLU, AutocastBFloat16LikeTorchLinear) {
  const LinearCase c = random_linear_case({16, 32}, 8, torch::kFloat);
  {
    afterburner::testing::BFloat16Autocast autocast;
    EXPECT_EQ(linear_relu(c.x, c.weight, c.bias).scalar_type(), torch::kBFloat16);
  }
  expect_matches_reference(c, 1e-2, true);
}

TEST(LinearReLU, DoubleInputsUnderAutocastStayDouble) {
  expect_matches_reference(random_linear_case({9, 6}, 5, torch::kDouble), 1e-10, true);
}

TEST(LinearReLU, BFloat16Inputs) { expect_matches_reference(random_linear_case({16, 32}, 8, torch::kBFloat16), 1e-2); }

TEST(LinearReLU, MismatchedShapesNameTheArgument) {
  const LinearCase c = random_linear_case({4, 6}, 5, torch::kFloat);
  using afterburner::testing::Contains;
  using afterburner::testing::error_message;
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { linear_relu(c.x.narrow(1, 0, 4), c.weight, c.bias); }),
                       "linear_relu x: expected [..., 6] to match weight [5, 6], got [4, 4]"));
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { linear_relu(c.x, c.weight, c.bias.narrow(0, 0, 2)); }),
                       "linear_relu bias: expected [5] to match weight [5, 6], got [2]"));
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { linear_relu(c.x, c.bias, c.bias); }),
                       "linear_relu weight: expected [out_features, in_features], got [5]"));
}

TEST(LinearReLUModule, DefaultInitializationMatchesLinear) {
  torch::manual_seed(3);
  torch::nn::Linear linear(7, 4);
  torch::manual_seed(3);
  LinearReLU fused(7, 4);
  EXPECT_TRUE(torch::equal(fused->weight, linear->weight));
  EXPECT_TRUE(torch::equal(fused->bias, linear->bias));
  const auto names = fused->named_parameters().keys();
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
}

TEST(LinearReLUModule, LinearWeightsCopyIn) {
  torch::nn::Linear linear(7, 4);
  LinearReLU fused(LinearReLUOptions(7, 4));
  {
    torch::NoGradGuard no_grad;
    for (auto& parameter : linear->named_parameters()) fused->named_parameters()[parameter.key()].copy_(parameter.value());
  }
  const torch::Tensor x = torch::randn({3, 7});
  EXPECT_TRUE(AllClose(fused(x), torch::relu(linear(x)), 1e-6));
}

TEST(LinearReLUModule, WithoutBiasHasOnlyWeight) {
  LinearReLU fused(LinearReLUOptions(7, 4).bias(false));
  EXPECT_FALSE(fused->bias.defined());
  EXPECT_EQ(fused->parameters().size(), 1u);
  const torch::Tensor x = torch::randn({3, 7});
  EXPECT_TRUE(AllClose(fused(x), torch::relu(x.mm(fused->weight.t())), 1e-6));
}

TEST(LinearReLUModule, FromLinearSharesParameters) {
  torch::nn::Linear linear(7, 4);
  LinearReLU fused = LinearReLUImpl::from_linear(linear);
  EXPECT_TRUE(fused->weight.is_same(linear->weight));
  EXPECT_TRUE(fused->bias.is_same(linear->bias));
  EXPECT_TRUE(fused->named_parameters()["weight"].is_same(linear->weight));
  EXPECT_EQ(fused->options.in_features(), 7);
  EXPECT_EQ(fused->options.out_features(), 4);

  const torch::Tensor x = torch::randn({3, 7});
  fused(x).sum().backward();
  ASSERT_TRUE(linear->weight.grad().defined());
  const torch::Tensor expected = torch::autograd::grad({torch::relu(linear(x)).sum()}, {linear->weight})[0];
  EXPECT_TRUE(AllClose(linear->weight.grad(), expected, 1e-6));

  torch::NoGradGuard no_grad;
  linear->bias.fill_(-100);
  EXPECT_EQ(fused(x).count_nonzero().item<int64_t>(), 0);
}

TEST(LinearReLUModule, FromLinearKeepsFrozenParametersFrozen) {
  torch::nn::Linear linear(torch::nn::LinearOptions(7, 4).bias(false));
  linear->weight.set_requires_grad(false);
  LinearReLU fused = LinearReLUImpl::from_linear(linear);
  EXPECT_FALSE(fused->weight.requires_grad());
  EXPECT_FALSE(fused->bias.defined());
}

TEST(LinearReLUModule, CloneHasItsOwnParameters) {
  LinearReLU fused(7, 4);
  auto copy = std::dynamic_pointer_cast<LinearReLUImpl>(fused->clone());
  ASSERT_TRUE(copy);
  EXPECT_FALSE(copy->weight.is_same(fused->weight));
  EXPECT_TRUE(torch::equal(copy->weight, fused->weight));
  EXPECT_TRUE(torch::equal(copy->bias, fused->bias));
}

TEST(LinearReLUModule, PrintsItsShape) {
  std::ostringstream printed;
  printed << *LinearReLU(LinearReLUOptions(7, 4).bias(false));
  EXPECT_EQ(printed.str(), "afterburner::kernels::LinearReLU(in_features=7, out_features=4, bias=false)");
}

}  // namespace
