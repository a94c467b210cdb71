// The randomized factorizations against their definitions, in double as Panther tests them
// (reconstruction and orthonormality below 1e-9), and against LAPACK's exact SVD.
#include "afterburner/linalg/randomized.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <tuple>

#include "afterburner/core/error.h"
#include "testing.h"

namespace afterburner::linalg {
namespace {

using testing::Contains;
using testing::error_message;

double relative(const torch::Tensor& difference, const torch::Tensor& reference) {
  return (difference.norm() / reference.norm()).item<double>();
}

double orthonormality(const torch::Tensor& Q) {
  return (Q.t().mm(Q) - torch::eye(Q.size(1), Q.options())).norm().item<double>();
}

// U diag(s) V^T with random orthonormal U, V and the given singular values.
torch::Tensor with_spectrum(int64_t m, int64_t n, const torch::Tensor& singular_values) {
  const int64_t r = singular_values.size(0);
  const torch::Tensor U = std::get<0>(torch::linalg_qr(torch::randn({m, r}, torch::kDouble)));
  const torch::Tensor V = std::get<0>(torch::linalg_qr(torch::randn({n, r}, torch::kDouble)));
  return (U * singular_values).mm(V.t());
}

class RandomizedSVDShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

// An exactly rank-k matrix comes back whole, with orthonormal factors and its singular values.
TEST_P(RandomizedSVDShapes, RecoversALowRankMatrixExactly) {
  const auto [m, n, k] = GetParam();
  torch::manual_seed(1);
  const torch::Tensor singular_values = torch::linspace(10.0, 1.0, k, torch::kDouble);
  const torch::Tensor A = with_spectrum(m, n, singular_values);
  const TruncatedSVD svd = randomized_svd(A, k, 0.0, RandomizedSVDOptions().block_size(16).seed(2));
  ASSERT_EQ(svd.U.sizes(), (std::vector<int64_t>{m, k}));
  ASSERT_EQ(svd.V.sizes(), (std::vector<int64_t>{n, k}));
  EXPECT_LE(relative(svd.U.mm(torch::diag(svd.S)).mm(svd.V.t()) - A, A), 1e-9);
  EXPECT_LE(orthonormality(svd.U), 1e-9);
  EXPECT_LE(orthonormality(svd.V), 1e-9);
  EXPECT_LE(relative(svd.S - singular_values, singular_values), 1e-9);
  const TruncatedSVD again = randomized_svd(A, k, 0.0, RandomizedSVDOptions().block_size(16).seed(2));
  EXPECT_TRUE(torch::equal(again.S, svd.S)) << "the same seed, the same answer";
}

// Tall, wide, square-ish; k below and equal to min(m, n); blocks of 16 (several blocks).
INSTANTIATE_TEST_SUITE_P(Shapes, RandomizedSVDShapes,
                         ::testing::Values(std::make_tuple(300, 80, 20), std::make_tuple(80, 300, 20),
                                           std::make_tuple(97, 61, 61), std::make_tuple(1, 7, 1),
                                           std::make_tuple(500, 200, 37)));

// On a full-rank matrix with a decaying spectrum, the rank-k error is within 1% of the best
// rank-k error (the exact SVD's tail), and the k singular values within 1e-6 of the exact ones.
TEST(RandomizedSVD, NearTheExactTruncatedSVDOnADecayingSpectrum) {
  torch::manual_seed(3);
  const torch::Tensor spectrum = torch::pow(0.9, torch::arange(200, torch::kDouble));
  const torch::Tensor A = with_spectrum(1000, 200, spectrum);
  const int64_t k = 30;
  const TruncatedSVD svd = randomized_svd(A, k, 0.0, RandomizedSVDOptions().seed(4));
  const torch::Tensor exact = torch::linalg_svdvals(A);
  const double best = exact.narrow(0, k, exact.size(0) - k).square().sum().sqrt().item<double>();
  const double error = (A - svd.U.mm(torch::diag(svd.S)).mm(svd.V.t())).norm().item<double>();
  EXPECT_LE(error, 1.01 * best);
  EXPECT_LE(relative(svd.S - exact.narrow(0, 0, k), exact.narrow(0, 0, k)), 1e-6);
  EXPECT_LE(orthonormality(svd.U), 1e-9);
}

// With a tolerance the range finder stops at the rank that meets it: a rank-12 matrix asked for
// 50 stops after the first block of 16 columns that captures it.
TEST(RandomizedSVD, StopsAtTheRankThatMeetsTheTolerance) {
  torch::manual_seed(5);
  const torch::Tensor A = with_spectrum(400, 300, torch::linspace(5.0, 1.0, 12, torch::kDouble));
  const TruncatedSVD svd = randomized_svd(A, 50, 1e-10, RandomizedSVDOptions().block_size(16).oversampling(0).seed(6));
  EXPECT_EQ(svd.S.size(0), 16);
  EXPECT_LE(relative(svd.U.mm(torch::diag(svd.S)).mm(svd.V.t()) - A, A), 1e-9);
  const TruncatedSVD full = randomized_svd(A, 50, 0.0, RandomizedSVDOptions().block_size(16).oversampling(0).seed(6));
  EXPECT_EQ(full.S.size(0), 50);
}

TEST(RandomizedSVD, Float32AndTorchsGeneratorLeftAlone) {
  torch::manual_seed(7);
  const torch::Tensor A = with_spectrum(200, 100, torch::linspace(3.0, 1.0, 10, torch::kDouble)).to(torch::kFloat);
  torch::manual_seed(8);
  const torch::Tensor expected = torch::rand({3});
  torch::manual_seed(8);
  const TruncatedSVD svd = randomized_svd(A, 10, 0.0, RandomizedSVDOptions().seed(1));
  EXPECT_TRUE(torch::equal(torch::rand({3}), expected)) << "a seeded call drew from torch's generator";
  EXPECT_EQ(svd.U.scalar_type(), torch::kFloat);
  EXPECT_LE(relative(svd.U.mm(torch::diag(svd.S)).mm(svd.V.t()) - A, A), 1e-5);
}

TEST(RandomizedSVD, ErrorsNameTheArgument) {
  const torch::Tensor A = torch::randn({20, 10}, torch::kDouble);
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { randomized_svd(A, 0); }), "randomized_svd k"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { randomized_svd(A, 11); }), "min(m, n) = 10"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { randomized_svd(A, 3, -1.0); }), "tol"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { randomized_svd(torch::randn({4}), 1); }), "2-D"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { randomized_svd(A.to(torch::kInt), 1); }), "Int"));
}

class CqrrptShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, sketch::SketchKind>> {};

// M[:, J] = Q R with Q orthonormal and R upper triangular, below 1e-9 in double, on an
// ill-conditioned matrix (a spectrum over 4 orders of magnitude, columns scaled over 3).
TEST_P(CqrrptShapes, FactorsAPermutedTallMatrix) {
  const auto [m, n, kind] = GetParam();
  torch::manual_seed(9);
  const torch::Tensor M =
      with_spectrum(m, n, torch::logspace(0, -4, n, 10, torch::kDouble)) * torch::logspace(0, 3, n, 10, torch::kDouble);
  const torch::Tensor before = M.clone();
  const PivotedQR qr = cqrrpt(M, 1.25, CqrrptOptions().sketch(kind).seed(10));
  ASSERT_EQ(qr.Q.sizes(), (std::vector<int64_t>{m, n}));
  ASSERT_EQ(qr.R.sizes(), (std::vector<int64_t>{n, n}));
  EXPECT_LE(relative(qr.Q.mm(qr.R) - M.index_select(1, qr.J), M), 1e-9);
  EXPECT_LE(orthonormality(qr.Q), 1e-9);
  EXPECT_TRUE(torch::equal(qr.R, qr.R.triu()));
  EXPECT_TRUE(torch::equal(std::get<0>(qr.J.sort()), torch::arange(n)));
  EXPECT_TRUE(torch::equal(M, before)) << "the input was written";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CqrrptShapes,
                         ::testing::Values(std::make_tuple(1000, 50, sketch::SketchKind::sjlt),
                                           std::make_tuple(1000, 50, sketch::SketchKind::gaussian),
                                           std::make_tuple(513, 97, sketch::SketchKind::srht),
                                           std::make_tuple(60, 60, sketch::SketchKind::sjlt),
                                           std::make_tuple(5, 1, sketch::SketchKind::gaussian)));

// Column pivoting orders R's diagonal by magnitude, and R is that of the pivoted columns' QR.
TEST(QrColumnPivoting, MatchesTheDefinition) {
  torch::manual_seed(11);
  const torch::Tensor M = torch::randn({40, 12}, torch::kDouble) * torch::logspace(0, 3, 12, 10, torch::kDouble);
  const PivotedQR qr = qr_column_pivoting(M.t().contiguous().t());  // a transposed view: its memory is not ours
  const torch::Tensor diagonal = qr.R.diagonal().abs();
  EXPECT_TRUE(torch::all(diagonal.narrow(0, 0, 11) >= diagonal.narrow(0, 1, 11)).item<bool>());
  // The R of the pivoted columns' QR, up to the signs of its rows (Householder's convention).
  const torch::Tensor R = std::get<1>(torch::linalg_qr(M.index_select(1, qr.J)));
  EXPECT_LE(relative(qr.R.abs() - R.abs(), R), 1e-12);
}

TEST(Cqrrpt, RefusesWhatItCannotFactor) {
  const torch::Tensor wide = torch::randn({10, 20}, torch::kDouble);
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { cqrrpt(wide); }), "tall matrix"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { cqrrpt(wide.t(), 0.5); }), "gamma"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { cqrrpt(wide.t(), 1.25, CqrrptOptions().rank(11)); }),
                       "cqrrpt rank"));
}

// A rank-deficient matrix gives its rank: two copied columns of ten leave rank 8, and
// M[:, J] = Q R with Q [m, 8] and R [8, 10] still holds.
TEST(Cqrrpt, RevealsTheRankOfARankDeficientMatrix) {
  torch::manual_seed(12);
  torch::Tensor M = torch::randn({100, 10}, torch::kDouble);
  M.select(1, 7).copy_(M.select(1, 2) * 3);
  M.select(1, 9).copy_(M.select(1, 0) - M.select(1, 4));
  const PivotedQR qr = cqrrpt(M, 1.25, CqrrptOptions().seed(1));
  ASSERT_EQ(qr.Q.sizes(), (std::vector<int64_t>{100, 8}));
  ASSERT_EQ(qr.R.sizes(), (std::vector<int64_t>{8, 10}));
  EXPECT_LE(relative(qr.Q.mm(qr.R) - M.index_select(1, qr.J), M), 1e-9);
  EXPECT_LE(orthonormality(qr.Q), 1e-9);
}

// Asked for rank k of a matrix with a decaying spectrum, the sketch has only 1.25 k rows and the
// approximation is within a small factor of the best rank-k error (pivoted QR is not the SVD).
TEST(Cqrrpt, ApproximatesAtTheRankAskedFor) {
  torch::manual_seed(13);
  const torch::Tensor spectrum = torch::pow(0.9, torch::arange(150, torch::kDouble));
  const torch::Tensor M = with_spectrum(2000, 150, spectrum);
  const PivotedQR qr = cqrrpt(M, 1.25, CqrrptOptions().rank(20).seed(2));
  ASSERT_EQ(qr.Q.sizes(), (std::vector<int64_t>{2000, 20}));
  const double best = spectrum.narrow(0, 20, 130).square().sum().sqrt().item<double>();
  const double error = (qr.Q.mm(qr.R) - M.index_select(1, qr.J)).norm().item<double>();
  EXPECT_LE(error, 10 * best);
  EXPECT_LE(orthonormality(qr.Q), 1e-9);
  EXPECT_TRUE(torch::equal(qr.R.narrow(1, 0, 20), qr.R.narrow(1, 0, 20).triu()));
}

}  // namespace
}  // namespace afterburner::linalg
