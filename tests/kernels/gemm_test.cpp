#include "afterburner/kernels/gemm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "autograd_check.h"

namespace {

namespace kernels = afterburner::kernels;
using afterburner::testing::AllClose;

// Products checked against the same product computed in double by LibTorch: the independent
// reference, whatever the operands' layout.
torch::Tensor reference_mm(const torch::Tensor& a, const torch::Tensor& b) {
  return at::mm(a.to(torch::kDouble), b.to(torch::kDouble));
}

constexpr double kFp32Tolerance = 1e-4;

TEST(Gemm, ContiguousOperandsMatchDoublePrecision) {
  torch::manual_seed(1);
  const auto a = torch::randn({37, 300}), b = torch::randn({300, 53});
  const auto c = kernels::mm(a, b);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_TRUE(AllClose(c, reference_mm(a, b), kFp32Tolerance, kFp32Tolerance));
}

TEST(Gemm, TransposedViewsAsTrainingUsesThem) {
  torch::manual_seed(2);
  const auto x = torch::randn({128, 3136}), weight = torch::randn({128, 3136}), g = torch::randn({128, 128});
  EXPECT_TRUE(AllClose(kernels::mm(x, weight.t()), reference_mm(x, weight.t()), 1e-3, kFp32Tolerance));
  EXPECT_TRUE(AllClose(kernels::mm(g.t(), x), reference_mm(g.t(), x), 1e-3, kFp32Tolerance));
  EXPECT_TRUE(AllClose(kernels::mm(g, weight), reference_mm(g, weight), 1e-3, kFp32Tolerance));
}

TEST(Gemm, RowStridedSlicesKeepTheirLeadingDimension) {
  torch::manual_seed(3);
  const auto wide = torch::randn({20, 40}), tall = torch::randn({50, 30});
  const auto a = wide.narrow(1, 5, 17);                     // [20, 17], row stride 40
  const auto b = tall.narrow(0, 3, 17).narrow(1, 2, 11);    // [17, 11], row stride 30, offset
  EXPECT_TRUE(AllClose(kernels::mm(a, b), reference_mm(a, b), kFp32Tolerance, kFp32Tolerance));
  EXPECT_TRUE(AllClose(kernels::mm(b.t(), a.t()), reference_mm(b.t(), a.t()), kFp32Tolerance, kFp32Tolerance));
}

TEST(Gemm, AddmmAddsTheBiasToEveryRow) {
  torch::manual_seed(4);
  const auto bias = torch::randn({9}), a = torch::randn({6, 15}), b = torch::randn({9, 15}).t();
  const auto expected = reference_mm(a, b) + bias.to(torch::kDouble);
  EXPECT_TRUE(AllClose(kernels::addmm(bias, a, b), expected, kFp32Tolerance, kFp32Tolerance));
}

TEST(Gemm, SingleRowsAndColumns) {
  torch::manual_seed(5);
  const auto row = torch::randn({1, 64}), column = torch::randn({64, 1}), square = torch::randn({64, 64});
  EXPECT_TRUE(AllClose(kernels::mm(row, column), reference_mm(row, column), kFp32Tolerance, kFp32Tolerance));
  EXPECT_TRUE(AllClose(kernels::mm(column, row), reference_mm(column, row), kFp32Tolerance, kFp32Tolerance));
  EXPECT_TRUE(AllClose(kernels::mm(row, square), reference_mm(row, square), kFp32Tolerance, kFp32Tolerance));
}

TEST(Gemm, OtherDtypesAndLayoutsGiveLibTorchsResult) {
  torch::manual_seed(6);
  const auto a = torch::randn({16, 32}), b = torch::randn({32, 8});
  const auto a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
  const auto bf16 = kernels::mm(a16, b16);
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(bf16, at::mm(a16, b16)));
  const auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
  EXPECT_TRUE(torch::equal(kernels::mm(ad, bd), at::mm(ad, bd)));
  const auto expanded = torch::randn({1, 32}).expand({16, 32});  // row stride 0: not a GEMM operand
  EXPECT_TRUE(AllClose(kernels::mm(expanded, b), reference_mm(expanded, b), kFp32Tolerance, kFp32Tolerance));
}

TEST(Gemm, EmptyProducts) {
  const auto a = torch::randn({4, 0}), b = torch::randn({0, 3});
  EXPECT_TRUE(torch::equal(kernels::mm(a, b), torch::zeros({4, 3})));
  const auto bias = torch::randn({3});
  EXPECT_TRUE(torch::equal(kernels::addmm(bias, a, b), bias.expand({4, 3})));
}

TEST(Gemm, MismatchedShapesRaiseLibTorchsError) {
  const auto a = torch::randn({4, 5}), b = torch::randn({6, 3});
  EXPECT_THROW(kernels::mm(a, b), c10::Error);
  EXPECT_THROW(kernels::mm(torch::randn({5}), b), c10::Error);
  EXPECT_THROW(kernels::addmm(torch::randn({2}), a, torch::randn({5, 3})), c10::Error);
}

}  // namespace

// Regression: with one row, bias.expand({1, N}).contiguous() is the bias itself, and the GEMM
// used to accumulate x W into it, so every call drifted further (issue 10).
TEST(Gemm, AddmmWithOneRowLeavesTheBiasUnchangedAndRepeats) {
  torch::manual_seed(7);
  const auto bias = torch::randn({5}), a = torch::randn({1, 12}), b = torch::randn({12, 5});
  const auto bias_before = bias.clone();
  const auto first = kernels::addmm(bias, a, b);
  const auto second = kernels::addmm(bias, a, b);
  EXPECT_TRUE(torch::equal(bias, bias_before));
  EXPECT_NE(first.data_ptr(), bias.data_ptr());
  EXPECT_TRUE(torch::equal(first, second));
  EXPECT_TRUE(AllClose(first, reference_mm(a, b) + bias_before.to(torch::kDouble), kFp32Tolerance, kFp32Tolerance));
}
