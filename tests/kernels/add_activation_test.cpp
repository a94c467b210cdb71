// kernels::add_activation against eager LibTorch's two ops and against them in double on the sum
// as the dtype holds it (an independent reference): relu bit for bit, silu within its roundings;
// fp32, bf16 and the two mixed pairs (the result fp32, each gradient in its term's dtype), over
// sizes across the 16-lane blocks and the parallel tasks, laid out as the terms; what the kernel
// does not take (broadcasting, strided views) as LibTorch's; NaN, infinities and -0 where
// LibTorch puts them; a second call, create_graph and a bad activation name. The contract
// (inputs unchanged, fresh outputs) is invariants_test's.
#include "afterburner/kernels/add_activation.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <utility>

#include "afterburner/core/error.h"
#include "invariants.h"

// A namespace of its own: the tests' unity build puts this file beside others.
namespace add_activation_test {
namespace {

namespace kernels = afterburner::kernels;
using afterburner::testing::BitwiseEqual;
using kernels::Activation;

torch::Tensor eager(const torch::Tensor& a, const torch::Tensor& b, Activation activation) {
  return activation == Activation::relu ? torch::relu(a + b) : torch::silu(a + b);
}

struct Answer {
  torch::Tensor y, grad_a, grad_b;
};

template <typename Op>
Answer differentiated(const Op& op, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& dy) {
  const torch::Tensor va = a.detach().requires_grad_(), vb = b.detach().requires_grad_();
  const torch::Tensor y = op(va, vb);
  const auto grads = torch::autograd::grad({y}, {va, vb}, {dy});
  return {y, grads[0], grads[1]};
}

Answer ours(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& dy, Activation activation) {
  return differentiated([&](const auto& x, const auto& y) { return kernels::add_activation(x, y, activation); }, a,
                        b, dy);
}

// The activation in double of the sum rounded to the result's dtype, and its gradient.
std::pair<torch::Tensor, torch::Tensor> reference(const torch::Tensor& a, const torch::Tensor& b,
                                                  const torch::Tensor& dy, Activation activation) {
  const torch::Dtype dtype = at::promote_types(a.scalar_type(), b.scalar_type());
  const torch::Tensor s = (a.to(torch::kDouble) + b.to(torch::kDouble)).to(dtype).to(torch::kDouble).requires_grad_();
  const torch::Tensor y = activation == Activation::relu ? torch::relu(s) : s * torch::sigmoid(s);
  return {y, torch::autograd::grad({y}, {s}, {dy.to(torch::kDouble)})[0]};
}

// The largest difference from `expected`, in units of the dtype's epsilon times max(1, |expected|).
double error_in_epsilons(const torch::Tensor& actual, const torch::Tensor& expected) {
  const double epsilon =
      actual.scalar_type() == torch::kBFloat16 ? 1.0 / 128 : std::numeric_limits<float>::epsilon();
  const torch::Tensor e = expected.to(torch::kDouble);
  return ((actual.to(torch::kDouble) - e).abs() / e.abs().clamp_min(1.0)).max().item<double>() / epsilon;
}

const std::pair<torch::Dtype, torch::Dtype> kDtypePairs[] = {{torch::kFloat, torch::kFloat},
                                                             {torch::kBFloat16, torch::kBFloat16},
                                                             {torch::kBFloat16, torch::kFloat},
                                                             {torch::kFloat, torch::kBFloat16}};

TEST(AddActivation, AgreesWithLibTorchAndWithDouble) {
  for (const Activation activation : {Activation::relu, Activation::silu}) {
    for (const auto& [a_dtype, b_dtype] : kDtypePairs) {
      for (const int64_t size : {1, 15, 16, 17, 37, 100003}) {  // 100,003: over 3 parallel grains, a tail of 3
        SCOPED_TRACE(::testing::Message() << (activation == Activation::relu ? "relu " : "silu ")
                                          << c10::toString(a_dtype) << " + " << c10::toString(b_dtype) << ", " << size);
        torch::manual_seed(size);
        const torch::Tensor a = (torch::randn({size}) * 3).to(a_dtype), b = (torch::randn({size}) * 3).to(b_dtype);
        const torch::Tensor dy = torch::randn({size}).to(at::promote_types(a_dtype, b_dtype));
        const Answer answer = ours(a, b, dy, activation);
        const Answer theirs = differentiated([&](const auto& x, const auto& y) { return eager(x, y, activation); }, a,
                                             b, dy);
        ASSERT_EQ(answer.y.scalar_type(), theirs.y.scalar_type());
        EXPECT_EQ(answer.grad_a.scalar_type(), a_dtype);
        EXPECT_EQ(answer.grad_b.scalar_type(), b_dtype);
        const auto [y, dx] = reference(a, b, dy, activation);
        if (activation == Activation::relu) {  // it selects: nothing to round
          EXPECT_TRUE(BitwiseEqual(answer.y, theirs.y));
          EXPECT_TRUE(BitwiseEqual(answer.grad_a, theirs.grad_a));
          EXPECT_TRUE(BitwiseEqual(answer.grad_b, theirs.grad_b));
        } else {
          // fp32: exp's polynomial and a few roundings; bf16: the result rounded once.
          const double bound = answer.y.scalar_type() == torch::kBFloat16 ? 0.51 : 8;
          EXPECT_LT(error_in_epsilons(answer.y, y), bound);
          // A term's gradient is the sum's, rounded to the term's dtype where it is narrower.
          EXPECT_LT(error_in_epsilons(answer.grad_a, dx), a_dtype == torch::kBFloat16 ? 0.51 : bound);
          EXPECT_LT(error_in_epsilons(answer.grad_b, dx), b_dtype == torch::kBFloat16 ? 0.51 : bound);
        }
        const Answer again = ours(a, b, dy, activation);
        EXPECT_TRUE(BitwiseEqual(again.y, answer.y) && BitwiseEqual(again.grad_a, answer.grad_a) &&
                    BitwiseEqual(again.grad_b, answer.grad_b))
            << "a second call answered otherwise";
      }
    }
  }
}

TEST(AddActivation, KeepsTheTermsLayoutAndHandsTheRestToLibTorch) {
  const auto channels_last = [](torch::Tensor t) { return t.contiguous(at::MemoryFormat::ChannelsLast); };
  const torch::Tensor a = channels_last(torch::randn({2, 3, 5, 7})), b = channels_last(torch::randn({2, 3, 5, 7}));
  const torch::Tensor dy = torch::randn({2, 3, 5, 7});  // contiguous: copied into the terms' layout
  for (const Activation activation : {Activation::relu, Activation::silu}) {
    const Answer answer = ours(a, b, dy, activation);
    EXPECT_EQ(answer.y.strides(), a.strides());
    EXPECT_EQ(answer.grad_a.strides(), a.strides());
    const auto [y, dx] = reference(a, b, dy, activation);
    EXPECT_LT(error_in_epsilons(answer.y, y), 8);
    EXPECT_LT(error_in_epsilons(answer.grad_a, dx), 8);
    // Terms dense alike in another order (transposed views) are the kernel's too.
    const Answer transposed = ours(a.transpose(2, 3), b.transpose(2, 3), dy.transpose(2, 3), activation);
    EXPECT_EQ(transposed.y.strides(), a.transpose(2, 3).strides());
    EXPECT_TRUE(BitwiseEqual(transposed.y, answer.y.transpose(2, 3)));
    EXPECT_TRUE(BitwiseEqual(transposed.grad_b, answer.grad_b.transpose(2, 3)));
    // Broadcasting (a per-channel term), a strided view and terms of two layouts: LibTorch's ops.
    for (const auto& [x, z] : {std::pair{a, torch::randn({3, 1, 1})}, std::pair{a.slice(3, 0, 7, 2), b.slice(3, 0, 7, 2)},
                               std::pair{a, b.contiguous()}}) {
      const torch::Tensor g = torch::randn(eager(x, z, activation).sizes());
      const Answer fallback = ours(x, z, g, activation);
      const Answer theirs = differentiated([&](const auto& p, const auto& q) { return eager(p, q, activation); }, x,
                                           z, g);
      EXPECT_TRUE(BitwiseEqual(fallback.y, theirs.y));
      EXPECT_TRUE(BitwiseEqual(fallback.grad_b, theirs.grad_b));
    }
  }
}

TEST(AddActivation, NonFiniteValuesAndSignedZerosGoWhereLibTorchPutsThem) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    const torch::Tensor a = torch::tensor({nan, inf, -inf, -0.0, 0.0, inf, 1.0, -1.0, 100.0, -100.0}).to(dtype);
    const torch::Tensor b = torch::tensor({1.0, 1.0, 1.0, -0.0, -0.0, -inf, 2.0, 2.0, 1.0, 1.0}).to(dtype);
    const torch::Tensor dy = torch::tensor({1.0, 1.0, 1.0, 1.0, 1.0, 1.0, nan, inf, -inf, 2.0}).to(dtype);
    for (const Activation activation : {Activation::relu, Activation::silu}) {
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype)
                                        << (activation == Activation::relu ? " relu" : " silu"));
      const Answer answer = ours(a, b, dy, activation);
      const Answer theirs = differentiated([&](const auto& x, const auto& y) { return eager(x, y, activation); }, a, b,
                                           dy);
      for (const auto& [mine, expected] : {std::pair{answer.y, theirs.y}, std::pair{answer.grad_a, theirs.grad_a}}) {
        EXPECT_TRUE(torch::equal(mine.isnan(), expected.isnan())) << mine << expected;
        EXPECT_TRUE(torch::equal(mine.isposinf(), expected.isposinf())) << mine << expected;
        EXPECT_TRUE(torch::equal(mine.isneginf(), expected.isneginf())) << mine << expected;
        if (activation == Activation::relu) {  // it keeps -0 as clamp_min does (a NaN's sign means nothing)
          EXPECT_TRUE(torch::equal(mine.signbit() & ~mine.isnan(), expected.signbit() & ~expected.isnan()))
              << mine << expected;
        }
      }
    }
  }
}

TEST(AddActivation, UnderCreateGraphTheGradientIsDifferentiable) {
  for (const Activation activation : {Activation::relu, Activation::silu}) {
    const torch::Tensor a = torch::randn({11}).requires_grad_(), b = torch::randn({11}).requires_grad_();
    const torch::Tensor da =
        torch::autograd::grad({kernels::add_activation(a, b, activation).pow(2).sum()}, {a}, {}, true, true)[0];
    const torch::Tensor second = torch::autograd::grad({da.sum()}, {b})[0];
    const torch::Tensor va = a.detach().requires_grad_(), vb = b.detach().requires_grad_();
    const torch::Tensor rda = torch::autograd::grad({eager(va, vb, activation).pow(2).sum()}, {va}, {}, true, true)[0];
    EXPECT_TRUE(torch::allclose(second, torch::autograd::grad({rda.sum()}, {vb})[0], 1e-5, 1e-6));
  }
}

TEST(AddActivation, AnActivationOfAnotherNameIsOneErrorNamingTheField) {
  EXPECT_EQ(kernels::activation_named("silu", "activation"), Activation::silu);
  try {
    kernels::activation_named("gelu", "activation");
    FAIL() << "no error";
  } catch (const afterburner::UsageError& error) {
    EXPECT_STREQ(error.what(), "activation: unknown activation 'gelu', expected relu or silu");
  }
}

}  // namespace
}  // namespace add_activation_test
