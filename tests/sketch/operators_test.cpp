#include "afterburner/sketch/operators.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "reference.h"
#include "testing.h"

namespace afterburner::sketch {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::error_message;
using reference::relative_error;

const std::vector<SketchKind> kAllKinds{SketchKind::gaussian, SketchKind::sign, SketchKind::sjlt, SketchKind::count,
                                        SketchKind::srht};

// H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]].
torch::Tensor sylvester_hadamard(int64_t n) {
  torch::Tensor h = torch::ones({1, 1}, torch::kDouble);
  while (h.size(0) < n) h = torch::cat({torch::cat({h, h}, 1), torch::cat({h, -h}, 1)}, 0);
  return h;
}

struct OperatorShape {
  int64_t input_dim, sketch_dim;
  std::vector<int64_t> batch;  // leading dimensions of x
};

// Rows drawn in `dtype`, [batch..., last]; when `strided`, a view whose last dimension is strided.
torch::Tensor draw_rows(const OperatorShape& shape, int64_t last, torch::ScalarType dtype, bool strided) {
  std::vector<int64_t> sizes = shape.batch;
  if (!strided) {
    sizes.push_back(last);
    return torch::randn(sizes, dtype);
  }
  sizes.insert(sizes.begin(), last);
  return torch::randn(sizes, dtype).movedim(0, -1);
}

class SketchOperatorKinds : public ::testing::TestWithParam<SketchKind> {};

// apply and transpose_apply against products with dense() in double, which builds S entry by
// entry from the definition (for srht from the closed form of the Hadamard entries).
TEST_P(SketchOperatorKinds, ApplyAndTransposeMatchTheDenseMatrix) {
  const std::vector<OperatorShape> shapes{{64, 16, {5}},  {100, 7, {3, 4}}, {3000, 128, {9}},
                                  {33, 33, {}},   {1, 1, {2}},      {1024, 5, {2, 1, 3}}};
  torch::manual_seed(3);
  for (const OperatorShape& shape : shapes) {
    const SketchOperator s(SketchOptions(GetParam(), shape.input_dim, shape.sketch_dim)
                               .nonzeros_per_column(std::min<int64_t>(3, shape.sketch_dim))
                               .seed(11));
    const torch::Tensor dense = s.dense();
    ASSERT_EQ(dense.sizes(), (std::vector<int64_t>{shape.sketch_dim, shape.input_dim}));
    ASSERT_EQ(dense.scalar_type(), torch::kDouble);
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      for (bool strided : {false, true}) {
        SCOPED_TRACE(fmt::format("{} -> {}, batch {}, {}{}", shape.input_dim, shape.sketch_dim,
                                 c10::str(torch::IntArrayRef(shape.batch)), c10::toString(dtype),
                                 strided ? ", strided" : ""));
        const torch::Tensor x = draw_rows(shape, shape.input_dim, dtype, strided);
        const torch::Tensor y = draw_rows(shape, shape.sketch_dim, dtype, strided);
        if (strided && x.numel() > x.size(-1) && x.size(-1) > 1) {
          ASSERT_FALSE(x.is_contiguous());
        }
        const double tolerance = dtype == torch::kFloat ? 1e-5 : 1e-12;
        const torch::Tensor sx = s.apply(x), sty = s.transpose_apply(y);
        EXPECT_EQ(sx.scalar_type(), dtype);
        EXPECT_EQ(sty.scalar_type(), dtype);
        EXPECT_LE(relative_error(sx, x.to(torch::kDouble).matmul(dense.t())), tolerance);
        EXPECT_LE(relative_error(sty, y.to(torch::kDouble).matmul(dense)), tolerance);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, SketchOperatorKinds, ::testing::ValuesIn(kAllKinds),
                         [](const ::testing::TestParamInfo<SketchKind>& info) { return to_string(info.param); });

// d/dx <g, S x> = S^T g and d/dy <h, S^T y> = S h, through autograd, against the dense matrix.
TEST(SketchOperator, GradientsAreTheTransposedMaps) {
  torch::manual_seed(6);
  for (SketchKind kind : kAllKinds) {
    const SketchOperator s(SketchOptions(kind, 50, 12).seed(5));
    const torch::Tensor dense = s.dense();
    const torch::Tensor x = torch::randn({4, 50}, torch::kDouble).requires_grad_();
    const torch::Tensor y = torch::randn({4, 12}, torch::kDouble).requires_grad_();
    const torch::Tensor g = torch::randn({4, 12}, torch::kDouble), h = torch::randn({4, 50}, torch::kDouble);
    const auto grad_x = torch::autograd::grad({s.apply(x)}, {x}, {g});
    const auto grad_y = torch::autograd::grad({s.transpose_apply(y)}, {y}, {h});
    EXPECT_LE(relative_error(grad_x[0], g.matmul(dense)), 1e-12) << to_string(kind);
    EXPECT_LE(relative_error(grad_y[0], h.matmul(dense.t())), 1e-12) << to_string(kind);
    // The backward is itself differentiable: the gradient of <u, S^T g> with respect to g is S u.
    const torch::Tensor g_leaf = g.clone().requires_grad_(), u = torch::randn({4, 50}, torch::kDouble);
    const auto again = torch::autograd::grad({s.apply(x)}, {x}, {g_leaf}, /*retain_graph=*/true, /*create_graph=*/true);
    const auto second = torch::autograd::grad({again[0]}, {g_leaf}, {u});
    EXPECT_LE(relative_error(second[0], u.matmul(dense.t())), 1e-12) << to_string(kind);
  }
}

TEST(SketchOperator, CountSketchHasOneUnitEntryPerColumn) {
  const torch::Tensor d = SketchOperator(SketchOptions(SketchKind::count, 300, 9).seed(1)).dense();
  EXPECT_TRUE(torch::equal(d.ne(0).sum(0), torch::ones({300}, torch::kLong)));
  EXPECT_TRUE(torch::equal(d.abs().sum(0), torch::ones({300}, torch::kDouble)));
  EXPECT_GT(d.gt(0).sum().item<int64_t>(), 100);  // both signs occur
  EXPECT_GT(d.lt(0).sum().item<int64_t>(), 100);
  EXPECT_TRUE(d.ne(0).sum(1).gt(0).all().item<bool>());  // every row gets columns
}

TEST(SketchOperator, SjltHasSDistinctRowsPerColumnOfMagnitudeOneOverRootS) {
  for (int64_t nonzeros : {1, 3, 8}) {
    const torch::Tensor d =
        SketchOperator(SketchOptions(SketchKind::sjlt, 400, 8).nonzeros_per_column(nonzeros).seed(2)).dense();
    // A repeated row would merge two entries into one (0 or +-2/sqrt(s)), so counting nonzeros of
    // magnitude 1/sqrt(s) checks that the rows are distinct.
    const torch::Tensor unit = (d.abs() - 1.0 / std::sqrt(static_cast<double>(nonzeros))).abs().lt(1e-15);
    EXPECT_TRUE(torch::equal(d.ne(0), unit)) << nonzeros;
    EXPECT_TRUE(torch::equal(unit.sum(0), torch::full({400}, nonzeros, torch::kLong))) << nonzeros;
  }
}

TEST(SketchOperator, SignEntriesArePlusOrMinusOneOverRootM) {
  const torch::Tensor d = SketchOperator(SketchOptions(SketchKind::sign, 200, 25).seed(3)).dense();
  EXPECT_TRUE(torch::allclose(d.abs(), torch::full_like(d, 0.2), 0, 1e-15));
  EXPECT_NEAR(d.gt(0).to(torch::kDouble).mean().item<double>(), 0.5, 0.02);
}

TEST(SketchOperator, SrhtRowsAreSignedHadamardRowsOverRootM) {
  for (int64_t n : {256, 100}) {
    const int64_t m = 32, padded = 128 * (n / 128 + (n % 128 != 0));
    const torch::Tensor d = SketchOperator(SketchOptions(SketchKind::srht, n, m).seed(4)).dense();
    EXPECT_TRUE(torch::allclose(d.abs(), torch::full_like(d, 1.0 / std::sqrt(m)), 0, 1e-15)) << n;
    // S_rj = H_{p_r, j} d_j / sqrt(m), and the product of Sylvester rows p and q is row p xor q: so
    // m S_r * S_0 (elementwise) is a row of H, a different one for each r as the kept rows differ.
    const torch::Tensor hadamard = sylvester_hadamard(padded).slice(1, 0, n);
    const torch::Tensor agreement = (d * d[0] * m).round().matmul(hadamard.t());  // [m, padded]
    const torch::Tensor matched = agreement.eq(n);
    EXPECT_TRUE(torch::equal(matched.sum(1), torch::ones({m}, torch::kLong))) << n;
    EXPECT_EQ(std::get<0>(torch::_unique(matched.to(torch::kLong).argmax(1))).numel(), m) << n;
    if (n == padded) {  // distinct rows of H D are orthogonal with squared norm n: S S^T = (n / m) I
      EXPECT_TRUE(torch::allclose(d.matmul(d.t()), torch::eye(m, torch::kDouble) * (n / m), 0, 1e-12));
    }
  }
}

TEST(WalshHadamard, MatchesTheSylvesterMatrix) {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (int64_t n : {1, 2, 8, 64, 512}) {
      torch::Tensor h = torch::eye(n, dtype);
      walsh_hadamard_(h);  // row i of I becomes H e_i, column i of H (H is symmetric)
      const torch::Tensor expected = sylvester_hadamard(n);
      EXPECT_TRUE(torch::equal(h.to(torch::kDouble), expected)) << n;
      EXPECT_TRUE(torch::equal(expected.matmul(expected.t()), torch::eye(n, torch::kDouble) * n)) << n;
    }
  }
}

TEST(WalshHadamard, TransformsEveryRowOfABatch) {
  torch::manual_seed(8);
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    torch::Tensor x = torch::randn({3, 50, 256}, dtype);
    const torch::Tensor expected = x.to(torch::kDouble).matmul(sylvester_hadamard(256));
    walsh_hadamard_(x);
    EXPECT_LE(relative_error(x, expected), dtype == torch::kFloat ? 1e-6 : 1e-14);
  }
}

TEST(WalshHadamard, RejectsWhatItCannotTransformInPlace) {
  for (torch::Tensor bad : {torch::zeros({4, 12}), torch::zeros({8, 4}).t(), torch::zeros({4, 8}, torch::kInt),
                            torch::zeros({}), torch::zeros({3, 0})}) {
    const std::string message = error_message<UsageError>([&] { walsh_hadamard_(bad); });
    EXPECT_TRUE(Contains(message, "walsh_hadamard_ rows")) << message;
  }
}

// Regression: the transform writes through data_ptr, which autograd does not see. It used to
// transform a tensor requiring grad silently, and to leave its version as it was, so a backward
// that had saved the tensor ran on the transformed values.
TEST(WalshHadamard, RefusesTensorsRequiringGradAndBumpsTheVersion) {
  torch::Tensor leaf = torch::randn({2, 8}, torch::requires_grad());
  const torch::Tensor before = leaf.detach().clone();
  const std::string message = error_message<UsageError>([&] { walsh_hadamard_(leaf); });
  EXPECT_TRUE(Contains(message, "walsh_hadamard_ rows: requires grad")) << message;
  EXPECT_TRUE(torch::equal(leaf.detach(), before));

  torch::Tensor weight = torch::randn({8}, torch::requires_grad());
  torch::Tensor rows = torch::randn({2, 8});
  const torch::Tensor product = (rows * weight).sum();  // saves rows for weight's gradient
  walsh_hadamard_(rows);
  EXPECT_THROW(product.backward(), c10::Error);  // "modified by an inplace operation"
  {
    torch::NoGradGuard no_grad;  // as initialisation code runs: allowed, like LibTorch's in-place ops
    walsh_hadamard_(leaf);
  }
  EXPECT_FALSE(torch::equal(leaf.detach(), before));
}

// (S^T S)_ij per kind: mean delta_ij, and this variance over draws (n' the padded input size).
double entry_variance(SketchKind kind, bool diagonal, double m, double padded) {
  if (kind == SketchKind::gaussian) return diagonal ? 2 / m : 1 / m;  // m terms g g' / m, g ~ N(0, 1)
  if (diagonal) return 0;  // columns of norm exactly 1
  // srht: (1/m) d_i d_j times a sum of m of the n' entries H_ki H_kj (which sum to 0), drawn
  // without replacement; the others: m rows each nonzero in both columns with probability (s/m)^2.
  return kind == SketchKind::srht ? (padded - m) / (m * (padded - 1)) : 1 / m;
}

TEST(SketchOperator, StatisticsAreUnbiasedWithinTheirVariance) {
  const int64_t n = 12, m = 4, padded = 16, draws = 3000;
  for (SketchKind kind : kAllKinds) {
    torch::Tensor sum = torch::zeros({n, n}, torch::kDouble);
    for (int64_t seed = 0; seed < draws; ++seed) {
      const torch::Tensor d = SketchOperator(SketchOptions(kind, n, m).nonzeros_per_column(2).seed(seed)).dense();
      sum += d.t().matmul(d);
    }
    const torch::Tensor mean = sum / draws, eye = torch::eye(n, torch::kDouble);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        // 5 standard errors of the mean, and rounding for the entries that are exact.
        const double tolerance = 5 * std::sqrt(entry_variance(kind, i == j, m, padded) / draws) + 1e-12;
        EXPECT_NEAR(mean[i][j].item<double>(), eye[i][j].item<double>(), tolerance)
            << to_string(kind) << " entry " << i << "," << j;
      }
    }
  }
}

// ||S x||^2 / ||x||^2 over draws of S: mean 1 within its standard error, spread at most about
// that of the Gaussian sketch (variance 2/m, a chi-square with m degrees over m). Besides a
// Gaussian x, a row of H: without its random signs D, the srht would map it to one spike of H x
// and the ratio would be 0 or n/m.
TEST(SketchOperator, SquaredNormRatioConcentratesAroundOne) {
  const int64_t n = 256, m = 64, draws = 400;
  torch::manual_seed(9);
  for (const torch::Tensor& x : {torch::randn({n}, torch::kDouble), sylvester_hadamard(n)[5]}) {
    const double norm2 = x.dot(x).item<double>();
    for (SketchKind kind : kAllKinds) {
      std::vector<double> ratios;
      for (int64_t seed = 0; seed < draws; ++seed) {
        const torch::Tensor sx = SketchOperator(SketchOptions(kind, n, m).seed(seed)).apply(x);
        ratios.push_back(sx.dot(sx).item<double>() / norm2);
      }
      const torch::Tensor r = torch::tensor(ratios, torch::kDouble);
      const double mean = r.mean().item<double>(), sd = r.std().item<double>();
      EXPECT_NEAR(mean, 1.0, 5 * sd / std::sqrt(draws)) << to_string(kind);
      EXPECT_GT(sd, 0) << to_string(kind);
      EXPECT_LT(sd, 1.25 * std::sqrt(2.0 / m)) << to_string(kind);
    }
  }
}

TEST(SketchOperator, SameSeedSameOperatorOtherSeedOther) {
  for (SketchKind kind : kAllKinds) {
    auto options = SketchOptions(kind, 40, 10);
    const torch::Tensor a = SketchOperator(options.seed(1)).dense();
    EXPECT_TRUE(torch::equal(a, SketchOperator(options.seed(1)).dense())) << to_string(kind);
    EXPECT_FALSE(torch::equal(a, SketchOperator(options.seed(2)).dense())) << to_string(kind);
  }
}

TEST(SketchOperator, WithoutASeedTorchManualSeedGovernsTheDraw) {
  for (SketchKind kind : kAllKinds) {
    torch::manual_seed(21);
    const SketchOperator first(SketchOptions(kind, 40, 10));
    const SketchOperator other(SketchOptions(kind, 40, 10));
    torch::manual_seed(21);
    const SketchOperator again(SketchOptions(kind, 40, 10));
    ASSERT_TRUE(first.options().seed().has_value());
    EXPECT_EQ(*first.options().seed(), *again.options().seed());
    EXPECT_TRUE(torch::equal(first.dense(), again.dense())) << to_string(kind);
    EXPECT_FALSE(torch::equal(first.dense(), other.dense())) << to_string(kind);
    // The recorded seed rebuilds the operator.
    EXPECT_TRUE(torch::equal(first.dense(), SketchOperator(first.options()).dense())) << to_string(kind);
  }
}

TEST(SketchOperator, KindNamesRoundTrip) {
  for (SketchKind kind : kAllKinds) EXPECT_EQ(parse_sketch_kind(to_string(kind)), kind);
  EXPECT_EQ(to_string(SketchKind::srht), "srht");
  const std::string message = error_message<UsageError>([] { parse_sketch_kind("fourier"); });
  EXPECT_TRUE(Contains(message, "sketch kind")) << message;
  EXPECT_TRUE(Contains(message, "fourier")) << message;
}

TEST(SketchOperator, RejectsSizesOutOfRangeNamingTheOption) {
  const std::vector<std::pair<SketchOptions, std::string>> cases{
      {SketchOptions(SketchKind::gaussian, 0, 1), "input_dim"},
      {SketchOptions(SketchKind::sign, 10, 11), "sketch_dim"},
      {SketchOptions(SketchKind::srht, 10, 0), "sketch_dim"},
      {SketchOptions(SketchKind::sjlt, 10, 3).nonzeros_per_column(4), "nonzeros_per_column"},
      {SketchOptions(SketchKind::sjlt, 10, 3).nonzeros_per_column(0), "nonzeros_per_column"},
  };
  for (const auto& option_case : cases) {  // (a lambda cannot capture a structured binding in C++17)
    const SketchOptions& options = option_case.first;
    const std::string message = error_message<UsageError>([&] { SketchOperator{options}; });
    EXPECT_TRUE(Contains(message, "SketchOptions " + option_case.second)) << message;
  }
  // The count sketch has one nonzero per column whatever nonzeros_per_column says.
  const SketchOperator count(SketchOptions(SketchKind::count, 10, 2).nonzeros_per_column(4));
  EXPECT_TRUE(torch::equal(count.dense().ne(0).sum(0), torch::ones({10}, torch::kLong)));
}

TEST(SketchOperator, RejectsInputOfTheWrongShapeOrDtype) {
  for (SketchKind kind : kAllKinds) {
    const SketchOperator s(SketchOptions(kind, 16, 4).seed(0));
    for (const torch::Tensor& bad :
         {torch::zeros({3, 15}), torch::zeros({16, 3}), torch::zeros({}), torch::zeros({3, 16}, torch::kInt)}) {
      const std::string message = error_message<UsageError>([&] { s.apply(bad); });
      EXPECT_TRUE(Contains(message, "SketchOperator input")) << message;
      EXPECT_TRUE(Contains(message, "[..., 16]")) << message;
    }
    const std::string message = error_message<UsageError>([&] { s.transpose_apply(torch::zeros({2, 16})); });
    EXPECT_TRUE(Contains(message, "[..., 4]")) << message;
  }
}

}  // namespace
}  // namespace afterburner::sketch
