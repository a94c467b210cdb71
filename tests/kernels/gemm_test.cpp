#include "afterburner/kernels/gemm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

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

namespace {

// gelu(z) = z Phi(z) = z (1 + erf(z / sqrt 2)) / 2, the erf form, in double.
torch::Tensor reference_gelu(const torch::Tensor& z) { return 0.5 * z * (1 + torch::erf(z / std::sqrt(2.0))); }

torch::Tensor reference_epilogue(const torch::Tensor& z, kernels::Epilogue epilogue) {
  switch (epilogue) {
    case kernels::Epilogue::gelu: return reference_gelu(z);
    case kernels::Epilogue::relu: return z.clamp_min(0);
    case kernels::Epilogue::identity: break;
  }
  return z;
}

// LibTorch's op for the epilogue, as the unfused graph runs it.
torch::Tensor libtorch_epilogue(const torch::Tensor& product, kernels::Epilogue epilogue) {
  switch (epilogue) {
    case kernels::Epilogue::gelu: return at::gelu(product);
    case kernels::Epilogue::relu: return at::relu(product);
    case kernels::Epilogue::identity: break;
  }
  return product;
}

const std::vector<kernels::Epilogue> kEpilogues{kernels::Epilogue::identity, kernels::Epilogue::gelu,
                                                kernels::Epilogue::relu};

torch::Tensor reference_addmm(const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b) {
  return reference_mm(a, b) + bias.to(torch::kDouble);
}

// A transformer MLP's first layer (K 96 -> N 384) over 3,136 tokens of 1-3 rows, and odd sizes.
const std::vector<std::vector<int64_t>> kFusedShapes{{1, 96, 384}, {3, 96, 384}, {3136, 96, 384}, {37, 17, 53}};

TEST(AddmmFused, Fp32MatchesDoublePrecisionWithEachEpilogue) {
  torch::manual_seed(8);
  for (const auto& shape : kFusedShapes) {
    const auto a = torch::randn({shape[0], shape[1]}), weight = torch::randn({shape[2], shape[1]}) / 10;
    const auto bias = torch::randn({shape[2]});
    const auto b = weight.t();  // as inference graphs hold it: W^T, a transposed view or a copy
    const auto z = reference_addmm(bias, a, b);
    EXPECT_TRUE(AllClose(kernels::addmm_fused(bias, a, b, kernels::Epilogue::identity), z, 1e-4, 1e-4));
    EXPECT_TRUE(AllClose(kernels::addmm_fused(bias, a, b.contiguous(), kernels::Epilogue::gelu), reference_gelu(z),
                         1e-4, 1e-4));
    EXPECT_TRUE(AllClose(kernels::addmm_fused(bias, a, b, kernels::Epilogue::relu), z.clamp_min(0), 1e-4, 1e-4));
  }
}

// bf16 operands, fp32 accumulation, the result rounded to bf16 once: within half a bf16 unit of
// the exact answer (at most 2^-8 of it) and the fp32 sum's own error.
TEST(AddmmFused, Bf16IsTheExactAnswerRoundedOnce) {
  torch::manual_seed(9);
  for (const auto& shape : kFusedShapes) {
    const auto a = torch::randn({shape[0], shape[1]}).to(torch::kBFloat16);
    const auto b = (torch::randn({shape[1], shape[2]}) / 10).to(torch::kBFloat16);
    const auto bias = torch::randn({shape[2]}).to(torch::kBFloat16);
    for (const auto epilogue : kEpilogues) {
      const auto y = kernels::addmm_fused(bias, a, b, epilogue);
      ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
      const auto exact = reference_epilogue(reference_addmm(bias, a, b), epilogue);
      const auto error = (y.to(torch::kDouble) - exact).abs();
      EXPECT_TRUE((error <= exact.abs() * std::ldexp(1.0, -8) + 1e-4).all().item<bool>())
          << "largest error " << error.max().item<double>();
    }
  }
}

// NaN and infinities come out where LibTorch's addmm then gelu or relu puts them (its gelu is
// oneDNN's eltwise, the post-op's own code; relu keeps NaN); inputs unchanged; a second call gives
// the same bits.
TEST(AddmmFused, PropagatesNonFiniteValuesAsLibTorchAndLeavesInputsAlone) {
  torch::manual_seed(10);
  auto a = torch::randn({6, 16});
  a[0][3] = std::numeric_limits<float>::quiet_NaN();
  a[1][0] = std::numeric_limits<float>::infinity();
  a[2][5] = -std::numeric_limits<float>::infinity();
  const auto b = torch::rand({16, 9}) + 0.1;  // positive: an infinite input makes an infinite sum
  auto bias = torch::randn({9});
  bias[4] = std::numeric_limits<float>::quiet_NaN();
  const auto a_before = a.clone(), b_before = b.clone(), bias_before = bias.clone();
  for (const auto epilogue : kEpilogues) {
    const auto expected = libtorch_epilogue(at::addmm(bias, a, b), epilogue);
    const auto first = kernels::addmm_fused(bias, a, b, epilogue), second = kernels::addmm_fused(bias, a, b, epilogue);
    EXPECT_TRUE(torch::equal(first.isnan(), expected.isnan()));
    EXPECT_TRUE(torch::equal(first.isposinf(), expected.isposinf()));
    EXPECT_TRUE(torch::equal(first.isneginf(), expected.isneginf()));
    const auto finite = expected.isfinite();
    EXPECT_TRUE(AllClose(first.masked_select(finite), expected.masked_select(finite), 1e-4, 1e-4));
    EXPECT_TRUE(torch::equal(first.nan_to_num(0), second.nan_to_num(0)));
  }
  EXPECT_TRUE(torch::equal(a.nan_to_num(0), a_before.nan_to_num(0)));
  EXPECT_TRUE(torch::equal(b, b_before));
  EXPECT_TRUE(torch::equal(bias.nan_to_num(0), bias_before.nan_to_num(0)));
}

// Cases oneDNN's primitive does not take are LibTorch's ops in sequence: the same bits, the same
// gradients, the same errors.
TEST(AddmmFused, OtherCasesAreLibTorchsOps) {
  torch::manual_seed(11);
  const auto a = torch::randn({5, 8}, torch::requires_grad()), b = torch::randn({8, 3}, torch::requires_grad());
  const auto bias = torch::randn({3}, torch::requires_grad());
  const auto ours = kernels::addmm_fused(bias, a, b, kernels::Epilogue::gelu);
  const auto theirs = at::gelu(at::addmm(bias, a, b));
  EXPECT_TRUE(torch::equal(ours, theirs));
  const auto ours_grads = torch::autograd::grad({ours.sum()}, {a, b, bias});
  const auto their_grads = torch::autograd::grad({theirs.sum()}, {a, b, bias});
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(ours_grads[i], their_grads[i]));
  const auto ad = a.detach().to(torch::kDouble), bd = b.detach().to(torch::kDouble);
  const auto biasd = bias.detach().to(torch::kDouble);
  for (const auto epilogue : kEpilogues) {
    EXPECT_TRUE(torch::equal(kernels::addmm_fused(biasd, ad, bd, epilogue),
                             libtorch_epilogue(at::addmm(biasd, ad, bd), epilogue)));
  }
  const auto broadcast_bias = torch::randn({1}).expand({3});
  EXPECT_TRUE(torch::equal(kernels::addmm_fused(broadcast_bias, a.detach(), b.detach(), kernels::Epilogue::identity),
                           at::addmm(broadcast_bias, a.detach(), b.detach())));
  EXPECT_THROW(kernels::addmm_fused(bias.detach(), a.detach().to(torch::kBFloat16), b.detach().to(torch::kBFloat16),
                                    kernels::Epilogue::gelu),
               c10::Error);  // an fp32 bias with bf16 operands: LibTorch's error
  EXPECT_THROW(kernels::addmm_fused(bias.detach(), a.detach(), torch::randn({7, 3}), kernels::Epilogue::identity),
               c10::Error);
}

}  // namespace
