#include "afterburner/kernels/cross_entropy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/threads.h"
#include "autograd_check.h"
#include "testing.h"

namespace {

using afterburner::kernels::cross_entropy;
using afterburner::testing::AllClose;
namespace F = torch::nn::functional;

torch::Tensor reference(const torch::Tensor& logits, const torch::Tensor& target) {
  return F::nll_loss(F::log_softmax(logits, F::LogSoftmaxFuncOptions(1)), target);
}

struct LossCase {
  torch::Tensor logits, target;
};

LossCase random_case(int64_t rows, int64_t classes, torch::Dtype dtype, double scale = 1) {
  torch::manual_seed(5);
  return {(torch::randn({rows, classes}, torch::kDouble) * scale).to(dtype).requires_grad_(),
          torch::randint(classes, {rows}, torch::kLong)};
}

struct LossAndGradient {
  torch::Tensor loss, grad;
};

using LossFunction = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

// The loss and its gradient for an upstream gradient that is not 1, to see it scales. With
// `autocast` the loss is computed under bf16 autocast and differentiated after it, as in training.
LossAndGradient evaluate(const LossFunction& loss_fn, const LossCase& c, bool autocast) {
  torch::Tensor loss;
  {
    std::optional<afterburner::testing::BFloat16Autocast> scope;
    if (autocast) scope.emplace();
    loss = loss_fn(c.logits, c.target);
  }
  const torch::Tensor upstream = torch::full({}, 0.7, loss.options());
  return {loss.detach(), torch::autograd::grad({loss}, {c.logits}, {upstream})[0]};
}

// Against torch on the same logits, the loss's dtype included.
void expect_matches_torch(const LossCase& c, double tolerance, bool autocast = false) {
  const LossAndGradient fused = evaluate(cross_entropy, c, autocast);
  const LossAndGradient expected = evaluate(reference, c, autocast);
  EXPECT_EQ(fused.loss.scalar_type(), expected.loss.scalar_type());
  EXPECT_EQ(fused.grad.scalar_type(), c.logits.scalar_type());
  EXPECT_TRUE(AllClose(fused.loss, expected.loss, tolerance, tolerance));
  EXPECT_TRUE(AllClose(fused.grad, expected.grad, tolerance, tolerance));
}

// Against torch in double on the very same (reduced-precision) logit values.
void expect_matches_double(const LossCase& c, double loss_tolerance, double grad_tolerance, bool autocast = false) {
  const LossAndGradient fused = evaluate(cross_entropy, c, autocast);
  const LossCase in_double{c.logits.detach().to(torch::kDouble).requires_grad_(), c.target};
  const LossAndGradient expected = evaluate(reference, in_double, false);
  EXPECT_TRUE(AllClose(fused.loss, expected.loss, loss_tolerance, loss_tolerance));
  EXPECT_TRUE(AllClose(fused.grad, expected.grad, grad_tolerance, grad_tolerance));
}

TEST(CrossEntropy, MatchesLogSoftmaxNllInDouble) { expect_matches_torch(random_case(13, 7, torch::kDouble), 1e-10); }

TEST(CrossEntropy, MatchesLogSoftmaxNllInFloat) { expect_matches_torch(random_case(128, 10, torch::kFloat), 1e-5); }

TEST(CrossEntropy, SingleRow) { expect_matches_torch(random_case(1, 10, torch::kDouble), 1e-10); }

TEST(CrossEntropy, ManyClassesSplitAcrossThreads) {
  afterburner::ThreadsGuard threads(2);
  expect_matches_torch(random_case(300, 1000, torch::kFloat), 1e-5);
}

// float and bf16 rows run a vectorized exp of afterburner's own: checked against double over a
// wide spread of logits, so that exp's whole reduced range and its underflow to 0 are exercised.
TEST(CrossEntropy, VectorizedExpMatchesDoubleOverManyClasses) {
  afterburner::ThreadsGuard threads(2);
  expect_matches_double(random_case(64, 1000, torch::kFloat, 30), 1e-5, 1e-7);
  expect_matches_double(random_case(64, 1003, torch::kFloat), 1e-5, 1e-7);  // a tail past the vector width
  expect_matches_double(random_case(16, 1000, torch::kBFloat16, 30), 4e-3, 4e-3);
}

// The special values, in the dtypes that take the vectorized path.
TEST(CrossEntropy, SpecialValuesInFloatAndBFloat16) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    LossCase c = random_case(4, 40, dtype);
    {
      torch::NoGradGuard no_grad;
      c.logits[0][5] = -std::numeric_limits<float>::infinity();
      c.logits[1].fill_(-std::numeric_limits<float>::infinity());
      c.logits[1][7] = 0.5;
      c.target[1] = 7;
    }
    expect_matches_double(c, 4e-3, 4e-3);
    {
      torch::NoGradGuard no_grad;
      c.logits[2][3] = std::numeric_limits<float>::quiet_NaN();
    }
    const LossAndGradient fused = evaluate(cross_entropy, c, false);
    EXPECT_TRUE(torch::isnan(fused.loss).item<bool>()) << c10::toString(dtype);
    EXPECT_TRUE(torch::isnan(fused.grad[2]).all().item<bool>()) << c10::toString(dtype);
    EXPECT_FALSE(torch::isnan(fused.grad[0]).any().item<bool>()) << c10::toString(dtype);
  }
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  const LossCase c = random_case(64, 10, torch::kFloat, 1e4);
  const LossAndGradient fused = evaluate(cross_entropy, c, false);
  EXPECT_TRUE(torch::isfinite(fused.loss).item<bool>());
  EXPECT_TRUE(torch::isfinite(fused.grad).all().item<bool>());
  expect_matches_double(c, 1e-5, 1e-6);
  expect_matches_torch(random_case(64, 10, torch::kDouble, 1e4), 1e-10);
}

TEST(CrossEntropy, MinusInfinityLogitsContributeNothing) {
  LossCase c = random_case(4, 5, torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    const double minus_infinity = -std::numeric_limits<double>::infinity();
    c.logits.select(1, 0).fill_(minus_infinity);  // first in its row: before any finite maximum
    c.logits[1][3] = minus_infinity;
    c.target.fill_(2);
  }
  expect_matches_torch(c, 1e-10);
}

TEST(CrossEntropy, NaNLogitGivesNaNLoss) {
  LossCase c = random_case(4, 5, torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    c.logits[3][1] = std::numeric_limits<double>::quiet_NaN();
  }
  EXPECT_TRUE(torch::isnan(cross_entropy(c.logits, c.target)).item<bool>());
}

TEST(CrossEntropy, BFloat16LogitsAccumulateInFloat) {
  const LossCase c = random_case(32, 10, torch::kBFloat16);
  EXPECT_EQ(cross_entropy(c.logits, c.target).scalar_type(), torch::kBFloat16);
  expect_matches_torch(c, 1e-2);
  // Only the final rounding to bf16 separates the results from double arithmetic.
  expect_matches_double(c, 4e-3, 4e-3);
}

// Under autocast torch computes cross-entropy in float: bf16 logits give a float loss.
TEST(CrossEntropy, AutocastBFloat16LikeTorch) {
  const LossCase bf16 = random_case(32, 10, torch::kBFloat16);
  {
    afterburner::testing::BFloat16Autocast autocast;
    EXPECT_EQ(cross_entropy(bf16.logits, bf16.target).scalar_type(), torch::kFloat);
  }
  expect_matches_torch(bf16, 1e-2, true);
  expect_matches_double(bf16, 1e-5, 4e-3, true);
  expect_matches_torch(random_case(32, 10, torch::kFloat), 1e-5, true);
}

TEST(CrossEntropy, FiniteDifferences) {
  const LossCase c = random_case(4, 5, torch::kDouble);
  afterburner::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& in) { return cross_entropy(in[0], c.target); }, {c.logits});
}

TEST(CrossEntropy, TargetOutOfRangeNamesValueAndClasses) {
  using afterburner::testing::Contains;
  using afterburner::testing::error_message;
  LossCase c = random_case(4, 10, torch::kFloat);
  c.target[2] = 10;
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { cross_entropy(c.logits, c.target); }),
                       "cross_entropy target: value 10 at row 2 is out of range for 10 classes"));
  c.target[2] = 0;
  c.target[3] = -1;
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { cross_entropy(c.logits, c.target); }),
                       "cross_entropy target: value -1 at row 3 is out of range for 10 classes"));
}

TEST(CrossEntropy, BadArgumentsNameTheArgument) {
  using afterburner::testing::Contains;
  using afterburner::testing::error_message;
  const LossCase c = random_case(4, 10, torch::kFloat);
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { cross_entropy(c.logits[0], c.target); }),
                       "cross_entropy logits: expected [rows, classes], got [10]"));
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { cross_entropy(c.logits.to(torch::kInt), c.target); }),
                       "cross_entropy logits: dtype Int is not supported"));
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { cross_entropy(c.logits, c.target.narrow(0, 0, 3)); }),
                       "cross_entropy target: expected int64 [4] for logits [4, 10], got Long [3]"));
  EXPECT_TRUE(Contains(error_message<afterburner::UsageError>([&] { cross_entropy(c.logits, c.target.to(torch::kInt)); }),
                       "cross_entropy target: expected int64 [4] for logits [4, 10], got Int [4]"));
}

}  // namespace
