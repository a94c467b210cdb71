// kernels::layer_norm against LayerNorm in double (an independent reference), forward and the
// gradients of the input, weight and bias: fp32 inputs, bf16 inputs under autocast (the fp32
// result of the input widened, the input's gradient rounded to bf16 once) and outside it (a bf16
// result rounded once), over row lengths
// across the 16-lane blocks and row counts across the 64-row blocks, with and without weight and
// bias, and a bias alone; the same bits with 1 and 2 threads and with autograd or without; the
// cases handed to at::layer_norm;
// NaN rows; the refusal of create_graph. The contract (inputs unchanged, fresh outputs) is
// invariants_test's.
#include "afterburner/kernels/layer_norm.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "afterburner/core/error.h"
#include "invariants.h"
#include "testing.h"

// A namespace of its own: the tests' unity build puts this file beside others.
namespace layer_norm_test {
namespace {

namespace kernels = afterburner::kernels;
using afterburner::testing::BitwiseEqual;
using afterburner::testing::Contains;

struct Result {
  torch::Tensor y, dx, dweight, dbias;
};

// y and the gradients for upstream dy, by `op`; weight and bias may be undefined.
template <typename Op>
Result run(const Op& op, const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
           const torch::Tensor& dy) {
  const torch::Tensor input = x.detach().requires_grad_();
  std::vector<torch::Tensor> leaves{input};
  torch::Tensor w, b;
  if (weight.defined()) leaves.push_back(w = weight.detach().requires_grad_());
  if (bias.defined()) leaves.push_back(b = bias.detach().requires_grad_());
  const torch::Tensor y = op(input, w, b);
  const auto grads = torch::autograd::grad({y}, leaves, {dy});
  Result r{y.detach(), grads[0], {}, {}};
  if (weight.defined()) r.dweight = grads[1];
  if (bias.defined()) r.dbias = grads.back();
  return r;
}

Result ours(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& dy) {
  return run([&](const torch::Tensor& v, const torch::Tensor& w,
                 const torch::Tensor& b) { return kernels::layer_norm(v, {x.size(-1)}, w, b, 1e-5); },
             x, weight, bias, dy);
}

Result in_double(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                 const torch::Tensor& dy) {
  const auto widen = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kDouble) : t; };
  return run([&](const torch::Tensor& v, const torch::Tensor& w,
                 const torch::Tensor& b) { return at::layer_norm(v, {x.size(-1)}, w, b, 1e-5); },
             widen(x), widen(weight), widen(bias), widen(dy));
}

// |actual - expected| <= tolerance * max(1, |expected|), elementwise.
void expect_near(const torch::Tensor& actual, const torch::Tensor& expected, double tolerance, const char* what) {
  ASSERT_EQ(actual.defined(), expected.defined()) << what;
  if (!actual.defined()) return;
  const torch::Tensor e = expected.to(torch::kDouble);
  const double worst = ((actual.to(torch::kDouble) - e).abs() / e.abs().clamp_min(1.0)).max().item<double>();
  EXPECT_LE(worst, tolerance) << what;
}

TEST(LayerNorm, Fp32AgreesWithDouble) {
  for (const int64_t d : {1, 15, 16, 17, 32, 37, 64}) {
    for (const int64_t rows : {1, 7, 130}) {  // 130 rows: three blocks of the weight's partial sums
      for (const bool affine : {true, false}) {
        SCOPED_TRACE(::testing::Message() << rows << " x " << d << (affine ? ", affine" : ""));
        torch::manual_seed(d * 1000 + rows);
        const torch::Tensor x = torch::randn({rows, d}) * 3 + 1, dy = torch::randn({rows, d});
        const torch::Tensor weight = affine ? torch::randn({d}) : torch::Tensor();
        const torch::Tensor bias = affine ? torch::randn({d}) : torch::Tensor();
        const Result got = ours(x, weight, bias, dy), want = in_double(x, weight, bias, dy);
        ASSERT_EQ(got.y.scalar_type(), torch::kFloat);
        expect_near(got.y, want.y, 1e-5, "y");
        // d = 1: every xhat is 0 and dx is rstd (g - g) = 0 up to rstd = 1/sqrt(eps) times a rounding.
        expect_near(got.dx, want.dx, d == 1 ? 1e-3 : 1e-5, "dx");
        expect_near(got.dweight, want.dweight, 1e-5 * std::sqrt(rows), "dweight");
        expect_near(got.dbias, want.dbias, 1e-5 * std::sqrt(rows), "dbias");
      }
    }
  }
}

TEST(LayerNorm, Bf16UnderAutocastComputesAutocastsFp32ResultFromTheInputAsItIs) {
  for (const int64_t d : {17, 32, 64}) {
    SCOPED_TRACE(::testing::Message() << "d = " << d);
    torch::manual_seed(d);
    const torch::Tensor x = (torch::randn({70, d}) * 2).to(torch::kBFloat16), dy = torch::randn({70, d});
    const torch::Tensor weight = torch::randn({d}), bias = torch::randn({d});
    Result got;
    {
      at::autocast::set_cpu_enabled(true);
      got = ours(x, weight, bias, dy);
      at::autocast::set_cpu_enabled(false);
    }
    const Result want = in_double(x, weight, bias, dy);  // x widened exactly
    ASSERT_EQ(got.y.scalar_type(), torch::kFloat);
    ASSERT_EQ(got.dx.scalar_type(), torch::kBFloat16);
    expect_near(got.y, want.y, 1e-5, "y");
    expect_near(got.dx, want.dx, 1.0 / 256 + 1e-5, "dx, rounded to bf16 once");
    expect_near(got.dweight, want.dweight, 1e-4, "dweight");
    expect_near(got.dbias, want.dbias, 1e-4, "dbias");
  }
}

// A bias without a weight: its gradient is the autograd Function's second tensor input, not its
// fourth argument.
TEST(LayerNorm, ABiasWithoutAWeightGetsItsGradient) {
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({9, 20}), dy = torch::randn({9, 20}), bias = torch::randn({20});
  const Result got = ours(x, {}, bias, dy), want = in_double(x, {}, bias, dy);
  ASSERT_FALSE(got.dweight.defined());
  expect_near(got.y, want.y, 1e-5, "y");
  expect_near(got.dx, want.dx, 1e-5, "dx");
  expect_near(got.dbias, want.dbias, 1e-5, "dbias");
}

TEST(LayerNorm, TheSameBitsWithOneAndTwoThreads) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({1000, 48}), dy = torch::randn({1000, 48});
  const torch::Tensor weight = torch::randn({48}), bias = torch::randn({48});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Result one = ours(x, weight, bias, dy);
  at::set_num_threads(2);
  const Result two = ours(x, weight, bias, dy);
  at::set_num_threads(threads);
  EXPECT_TRUE(BitwiseEqual(one.y, two.y));
  EXPECT_TRUE(BitwiseEqual(one.dx, two.dx));
  EXPECT_TRUE(BitwiseEqual(one.dweight, two.dweight));
  EXPECT_TRUE(BitwiseEqual(one.dbias, two.dbias));
  const Result again = ours(x, weight, bias, dy);
  EXPECT_TRUE(BitwiseEqual(again.dweight, one.dweight)) << "a second call answered otherwise";
}

TEST(LayerNorm, OtherLayoutsAndLeadingDimensions) {
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({5, 33, 6}).transpose(0, 1);  // [33, 5, 6], not contiguous
  const torch::Tensor dy = torch::randn({33, 5, 6}), weight = torch::randn({6}), bias = torch::randn({6});
  const Result got = ours(x, weight, bias, dy), want = in_double(x, weight, bias, dy);
  expect_near(got.y, want.y, 1e-5, "y");
  expect_near(got.dx, want.dx, 1e-5, "dx");
  expect_near(got.dweight, want.dweight, 1e-4, "dweight");
}

// Outside autocast a bf16 input gives a bf16 result, rounded once from fp32 (LibTorch 1.13's bf16
// kernel rounds along the way: further from the exact answer), with bf16 or fp32 weight and bias;
// the gradients in the dtypes of what they are for.
TEST(LayerNorm, Bf16OutsideAutocastIsTheExactAnswerRoundedOnce) {
  for (const torch::Dtype affine_type : {torch::kBFloat16, torch::kFloat}) {
    SCOPED_TRACE(::testing::Message() << "weight and bias " << affine_type);
    torch::manual_seed(7);
    const torch::Tensor x = (torch::randn({150, 96}) * 3 + 1).to(torch::kBFloat16), dy = torch::randn({150, 96});
    const torch::Tensor weight = torch::randn({96}).to(affine_type), bias = torch::randn({96}).to(affine_type);
    const torch::Tensor upstream = dy.to(torch::kBFloat16);
    const Result got = ours(x, weight, bias, upstream), want = in_double(x, weight, bias, upstream);
    ASSERT_EQ(got.y.scalar_type(), torch::kBFloat16);
    ASSERT_EQ(got.dx.scalar_type(), torch::kBFloat16);
    ASSERT_EQ(got.dweight.scalar_type(), affine_type);
    ASSERT_EQ(got.dbias.scalar_type(), affine_type);
    expect_near(got.y, want.y, 1.0 / 256, "y, rounded to bf16 once");
    expect_near(got.dx, want.dx, 1.0 / 256 + 1e-5, "dx, rounded to bf16 once");
    const double rounding = affine_type == torch::kBFloat16 ? 1.0 / 256 : 1e-4;
    expect_near(got.dweight, want.dweight, rounding, "dweight");
    expect_near(got.dbias, want.dbias, rounding, "dbias");
    if (affine_type == torch::kBFloat16) {
      const torch::Tensor libtorch = at::layer_norm(x, {96}, weight, bias, 1e-5);
      const auto error = [&](const torch::Tensor& y) {
        return (y.to(torch::kDouble) - want.y).abs().max().item<double>();
      };
      EXPECT_LE(error(got.y), error(libtorch));
    }
  }
}

// bf16_for_autocast: under autocast the fp32 result rounded to bf16 as autocast's cast rounds it,
// and through a Linear the same output and gradients, bit for bit, as the fp32 result cast by
// autocast; outside autocast no effect.
TEST(LayerNorm, Bf16ForAutocastIsAutocastsCastOfTheResult) {
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({70, 40}) * 2, weight = torch::randn({40}), bias = torch::randn({40});
  const torch::Tensor linear_weight = torch::randn({24, 40}), dz = torch::randn({70, 24});
  const auto through_linear = [&](bool bf16_for_autocast) {
    return run(
        [&](const torch::Tensor& v, const torch::Tensor& w, const torch::Tensor& b) {
          const torch::Tensor y = kernels::layer_norm(v, {40}, w, b, 1e-5, bf16_for_autocast);
          EXPECT_EQ(y.scalar_type(), bf16_for_autocast ? torch::kBFloat16 : torch::kFloat);
          return torch::linear(y, linear_weight);
        },
        x, weight, bias, dz.to(torch::kBFloat16));
  };
  at::autocast::set_cpu_enabled(true);
  const Result marked = through_linear(true), plain = through_linear(false);
  at::autocast::set_cpu_enabled(false);
  EXPECT_TRUE(BitwiseEqual(marked.y, plain.y));
  EXPECT_TRUE(BitwiseEqual(marked.dx, plain.dx));
  EXPECT_TRUE(BitwiseEqual(marked.dweight, plain.dweight));
  EXPECT_TRUE(BitwiseEqual(marked.dbias, plain.dbias));
  EXPECT_EQ(kernels::layer_norm(x, {40}, weight, bias, 1e-5, true).scalar_type(), torch::kFloat);  // no autocast
}

// Where nothing needs a gradient (inference) the statistics are not kept: the same bits.
TEST(LayerNorm, WithoutAutogradTheSameBitsAsWithIt) {
  torch::manual_seed(8);
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    const torch::Tensor x = torch::randn({70, 40}).to(dtype), weight = torch::randn({40}), bias = torch::randn({40});
    const torch::Tensor recorded = kernels::layer_norm(x.detach().requires_grad_(), {40}, weight, bias, 1e-5);
    ASSERT_TRUE(recorded.requires_grad());
    torch::Tensor inferred;
    {
      c10::InferenceMode inference;
      inferred = kernels::layer_norm(x, {40}, weight, bias, 1e-5);
    }
    EXPECT_TRUE(BitwiseEqual(inferred, recorded.detach()));
  }
}

TEST(LayerNorm, CasesItDoesNotTakeAreLibTorchsBitForBit) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({9, 20}, torch::kDouble);
  const torch::Tensor weight = torch::randn({20}, torch::kDouble), bias = torch::randn({20}, torch::kDouble);
  EXPECT_TRUE(
      BitwiseEqual(kernels::layer_norm(x, {20}, weight, bias, 1e-5), at::layer_norm(x, {20}, weight, bias, 1e-5)));
  // Normalized over the last two dimensions.
  const torch::Tensor matrix_weight = torch::randn({3, 20});
  const torch::Tensor rows = torch::randn({4, 3, 20});
  EXPECT_TRUE(torch::allclose(kernels::layer_norm(rows, {3, 20}, matrix_weight, {}, 1e-5),
                              at::layer_norm(rows, {3, 20}, matrix_weight, {}, 1e-5), 1e-5, 1e-5));
}

TEST(LayerNorm, ANanRowIsNanAndTheOthersAreUntouched) {
  torch::Tensor x = torch::randn({4, 16});
  x[2][5] = std::nan("");
  const torch::Tensor y = kernels::layer_norm(x, {16}, {}, {}, 1e-5);
  const torch::Tensor reference = at::layer_norm(x, {16}, {}, {}, 1e-5);
  EXPECT_TRUE(torch::equal(y.isnan(), reference.isnan()));
  EXPECT_TRUE(y[2].isnan().all().item<bool>());
  EXPECT_TRUE(torch::allclose(y.index({torch::indexing::Slice(0, 2)}), reference.index({torch::indexing::Slice(0, 2)}),
                              1e-5, 1e-5));
}

TEST(LayerNorm, SecondOrderGradientsAreRefusedInOneLine) {
  const torch::Tensor x = torch::randn({3, 8}, torch::requires_grad());
  const torch::Tensor y = kernels::layer_norm(x, {8}, {}, {}, 1e-5);
  try {
    torch::autograd::grad({y.square().sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph was not refused";
  } catch (const std::exception& e) {
    EXPECT_TRUE(Contains(e.what(), "second-order gradients (create_graph) are not supported")) << e.what();
  }
}

}  // namespace
}  // namespace layer_norm_test
