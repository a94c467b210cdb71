// low_rank_linear against scale (x a) b + bias computed by LibTorch in double: output and every
// gradient, fp32 and under bf16 autocast, with strided operands; bad shapes name the operand.
#include "afterburner/kernels/low_rank.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "afterburner/core/error.h"
#include "autograd_check.h"
#include "testing.h"

namespace {

using afterburner::kernels::low_rank_linear;
using afterburner::testing::AllClose;

struct Operands {
  torch::Tensor x, a, b, bias;
  std::vector<torch::Tensor> all() const {
    std::vector<torch::Tensor> out{x, a, b};
    if (bias.defined()) out.push_back(bias);
    return out;
  }
};

// x [M, K] (a transposed view when strided), a [K, R], b [R, N].
Operands random_operands(int64_t m, int64_t k, int64_t r, int64_t n, bool with_bias, bool strided) {
  torch::manual_seed(5);
  Operands o;
  o.x = strided ? torch::randn({k, m}).t() : torch::randn({m, k});
  o.a = torch::randn({k, r}) / std::sqrt(static_cast<double>(k));
  o.b = torch::randn({r, n}) / std::sqrt(static_cast<double>(r));
  if (with_bias) o.bias = torch::randn({n});
  for (auto* t : {&o.x, &o.a, &o.b, &o.bias}) {
    if (t->defined()) t->requires_grad_();
  }
  return o;
}

// The same map by LibTorch's ops in double.
torch::Tensor reference(const Operands& d, double scale) {
  torch::Tensor y = d.x.mm(d.a).mm(d.b) * scale;
  return d.bias.defined() ? y + d.bias : y;
}

void expect_matches_reference(const Operands& o, double scale, double tolerance, bool autocast) {
  torch::Tensor y;
  {
    std::optional<afterburner::testing::BFloat16Autocast> scope;
    if (autocast) scope.emplace();
    y = low_rank_linear(o.x, o.a, o.b, o.bias, scale);
  }
  EXPECT_EQ(y.scalar_type(), autocast ? torch::kBFloat16 : torch::kFloat);
  Operands d;
  std::vector<torch::Tensor*> fields{&d.x, &d.a, &d.b, &d.bias};
  const std::vector<torch::Tensor> originals{o.x, o.a, o.b, o.bias};
  for (size_t i = 0; i < fields.size(); ++i) {
    if (originals[i].defined()) *fields[i] = originals[i].detach().to(torch::kDouble).requires_grad_();
  }
  const torch::Tensor expected = reference(d, scale);
  const torch::Tensor upstream = torch::randn(expected.sizes(), torch::kDouble);
  EXPECT_TRUE(AllClose(y, expected, tolerance, tolerance));
  const auto grads = torch::autograd::grad({y}, o.all(), {upstream.to(y.scalar_type())});
  const auto expected_grads = torch::autograd::grad({expected}, d.all(), {upstream});
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ(grads[i].scalar_type(), torch::kFloat) << "operand " << i;  // each in its own dtype
    EXPECT_TRUE(AllClose(grads[i], expected_grads[i], tolerance, tolerance)) << "operand " << i;
  }
}

class LowRankLinear : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(LowRankLinear, OutputAndGradientsMatchLibTorchInDouble) {
  const auto [with_bias, strided] = GetParam();
  expect_matches_reference(random_operands(48, 300, 32, 200, with_bias, strided), 0.25, 1e-4, false);
}

TEST_P(LowRankLinear, UnderBf16AutocastLikeLibTorch) {
  const auto [with_bias, strided] = GetParam();
  expect_matches_reference(random_operands(16, 96, 16, 64, with_bias, strided), 0.5, 0.05, true);
}

INSTANTIATE_TEST_SUITE_P(BiasAndLayout, LowRankLinear, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(LowRankLinearGradients, MatchFiniteDifferences) {
  torch::manual_seed(6);
  const auto options = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
  std::vector<torch::Tensor> inputs{torch::randn({3, 5}, options), torch::randn({5, 2}, options),
                                    torch::randn({2, 4}, options), torch::randn({4}, options)};
  afterburner::testing::expect_gradients_match_finite_differences(
      [](const std::vector<torch::Tensor>& v) { return low_rank_linear(v[0], v[1], v[2], v[3], 0.3).pow(2).sum(); },
      inputs);
}

TEST(LowRankLinearErrors, BadShapesNameTheOperand) {
  using afterburner::testing::Contains;
  using afterburner::testing::error_message;
  using afterburner::UsageError;
  const torch::Tensor x = torch::randn({4, 8}), a = torch::randn({8, 2}), b = torch::randn({2, 6});
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { low_rank_linear(torch::randn({4, 7}), a, b, {}, 1); }),
                       "low_rank_linear x: expected [M, 8], got [4, 7]"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { low_rank_linear(x, a, torch::randn({3, 6}), {}, 1); }),
                       "low_rank_linear b: expected [2, N], got [3, 6]"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { low_rank_linear(x, a, b, torch::randn({5}), 1); }),
                       "low_rank_linear bias: expected [6], got [5]"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { low_rank_linear(x, torch::randn({8}), b, {}, 1); }),
                       "low_rank_linear a: expected [K, R], got [8]"));
}

}  // namespace
