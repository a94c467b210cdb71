// low_rank_linear against scale (x a) b + bias computed by LibTorch in double: output and every
// gradient, fp32 and under bf16 autocast, with strided operands; bad shapes name the operand.
// Its epilogue (relu, dropout) against low_rank_linear followed by LibTorch's relu and dropout
// from the same seed: the same bits forward and in the gradients, the generator left alike;
// p = 1 and evaluation draw nothing.
#include "afterburner/kernels/low_rank.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "afterburner/core/error.h"
#include "autograd_check.h"
#include "non_finite.h"
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

// The epilogue fused, or LibTorch's relu and dropout after the plain low-rank product: output,
// gradients (x, a, b, bias) and the generator's next draws, from seed 3.
struct EpilogueRun {
  torch::Tensor output, after;
  std::vector<torch::Tensor> grads;
};

EpilogueRun run_epilogue(const Operands& o, const afterburner::kernels::LowRankEpilogue& e, bool fused, bool autocast) {
  torch::manual_seed(3);
  EpilogueRun r;
  {
    std::optional<afterburner::testing::BFloat16Autocast> scope;
    if (autocast) scope.emplace();
    if (fused) {
      r.output = low_rank_linear(o.x, o.a, o.b, o.bias, 0.25, e);
    } else {
      r.output = low_rank_linear(o.x, o.a, o.b, o.bias, 0.25);
      if (e.relu()) r.output = torch::relu(r.output);
      r.output = torch::dropout(r.output, e.dropout(), e.train());
    }
  }
  r.after = torch::rand({4}, torch::kDouble);
  const torch::Tensor upstream = torch::randn(r.output.sizes(), torch::kDouble).to(r.output.scalar_type());
  r.grads = torch::autograd::grad({r.output}, o.all(), {upstream});
  return r;
}

// Bitwise equal, every NaN counting as one: LibTorch's vectorised bf16 rounding writes a NaN as
// 0xffff, its scalar rounding (and the epilogue's) as 0x7fc0.
bool SameBitsAnyNaN(const torch::Tensor& a, const torch::Tensor& b) {
  using afterburner::testing::BitwiseEqual;
  return BitwiseEqual(a.isnan(), b.isnan()) && BitwiseEqual(a.masked_fill(a.isnan(), 0), b.masked_fill(b.isnan(), 0));
}

class LowRankEpilogueTest : public ::testing::TestWithParam<std::tuple<bool, double, bool>> {};

TEST_P(LowRankEpilogueTest, SameBitsAsLibTorchsReluAndDropoutAfterIt) {
  const auto [relu, p, autocast] = GetParam();
  using afterburner::testing::BitwiseEqual;
  for (const int64_t rows : {1, 7, 130}) {
    Operands o = random_operands(rows, 96, 16, 200, true, rows == 7);
    {  // NaN, infinities and -0 in the input and bias (-0 rows: relu keeps -0, the mask must see it)
      const torch::NoGradGuard no_grad;
      o.x[0][3] = std::nan("");
      o.x[0][5] = INFINITY;
      o.bias[7] = -INFINITY;
    }
    const auto e = afterburner::kernels::LowRankEpilogue().relu(relu).dropout(p).train(true);
    const EpilogueRun fused = run_epilogue(o, e, true, autocast), unfused = run_epilogue(o, e, false, autocast);
    EXPECT_TRUE(SameBitsAnyNaN(fused.output, unfused.output)) << rows << " rows";
    EXPECT_TRUE(BitwiseEqual(fused.after, unfused.after)) << "the generator after " << rows << " rows";
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(SameBitsAnyNaN(fused.grads[i], unfused.grads[i])) << "operand " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(ReluDropoutPrecision, LowRankEpilogueTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0.0, 0.3, 1.0), ::testing::Bool()));

TEST(LowRankEpilogue, MatchesLibTorchInDoubleAndFiniteDifferences) {
  torch::manual_seed(8);
  const auto options = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
  std::vector<torch::Tensor> inputs{torch::randn({9, 5}, options), torch::randn({5, 3}, options),
                                    torch::randn({3, 6}, options), torch::randn({6}, options)};
  const auto e = afterburner::kernels::LowRankEpilogue().relu(true).dropout(0.4).train(true);
  const auto fused = [&](const std::vector<torch::Tensor>& v) {
    torch::manual_seed(4);  // the same mask on every evaluation
    return low_rank_linear(v[0], v[1], v[2], v[3], 0.3, e);
  };
  torch::manual_seed(4);
  const torch::Tensor expected =
      torch::dropout(torch::relu(torch::addmm(inputs[3], inputs[0].mm(inputs[1]) * 0.3, inputs[2])), 0.4, true);
  EXPECT_TRUE(AllClose(fused(inputs), expected, 1e-12, 1e-12));
  afterburner::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& v) { return fused(v).pow(2).sum(); }, inputs);
}

TEST(LowRankEpilogue, EvaluationDrawsNothing) {
  const Operands o = random_operands(5, 8, 2, 4, true, false);
  torch::manual_seed(2);
  const torch::Tensor y =
      low_rank_linear(o.x, o.a, o.b, o.bias, 1.0, afterburner::kernels::LowRankEpilogue().relu(true).dropout(0.5));
  const torch::Tensor after = torch::rand({3});
  torch::manual_seed(2);
  EXPECT_TRUE(torch::equal(after, torch::rand({3})));
  EXPECT_TRUE(torch::equal(y, torch::relu(low_rank_linear(o.x, o.a, o.b, o.bias, 1.0))));
}

TEST(LowRankEpilogue, DropoutOutsideZeroToOneIsAnError) {
  using afterburner::testing::Contains;
  using afterburner::testing::error_message;
  const torch::Tensor x = torch::randn({4, 8}), a = torch::randn({8, 2}), b = torch::randn({2, 6});
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] {
                         low_rank_linear(x, a, b, {}, 1, afterburner::kernels::LowRankEpilogue().dropout(1.5));
                       }),
                       "low_rank_linear dropout: must be between 0 and 1, got 1.5"));
}

}  // namespace
