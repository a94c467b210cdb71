// kernels::gelu: the forward is LibTorch's own (bit for bit); the gradient, ours, against the
// erf formula differentiated in double by autograd (an independent reference) and against
// at::gelu_backward, in fp32 and bf16, over sizes across the 16-lane blocks and the parallel
// tasks; gradients laid out as their input where dy and x are dense alike; expanded and
// transposed upstream gradients; NaN and infinities where at::gelu_backward puts them. The
// contract (inputs unchanged, fresh outputs) is invariants_test's.
#include "afterburner/kernels/gelu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "invariants.h"

// A namespace of its own: the tests' unity build puts this file beside others.
namespace gelu_test {
namespace {

namespace kernels = afterburner::kernels;
using afterburner::testing::BitwiseEqual;

// d/dx of x / 2 (1 + erf(x / sqrt(2))), by autograd in double, times dy.
torch::Tensor reference_gradient(const torch::Tensor& dy, const torch::Tensor& x) {
  const torch::Tensor v = x.to(torch::kDouble).detach().requires_grad_();
  const torch::Tensor y = v * 0.5 * (1 + torch::erf(v / std::sqrt(2.0)));
  return torch::autograd::grad({y}, {v}, {dy.to(torch::kDouble)})[0];
}

torch::Tensor our_gradient(const torch::Tensor& dy, const torch::Tensor& x) {
  const torch::Tensor v = x.detach().requires_grad_();
  return torch::autograd::grad({kernels::gelu(v)}, {v}, {dy})[0];
}

// The largest difference from `expected`, in units of the dtype's epsilon times max(1, |expected|).
double error_in_epsilons(const torch::Tensor& actual, const torch::Tensor& expected, torch::Dtype dtype) {
  const double epsilon = dtype == torch::kBFloat16 ? 1.0 / 128 : std::numeric_limits<float>::epsilon();
  const torch::Tensor e = expected.to(torch::kDouble);
  return ((actual.to(torch::kDouble) - e).abs() / e.abs().clamp_min(1.0)).max().item<double>() / epsilon;
}

TEST(Gelu, ForwardIsLibTorchsBitForBit) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
    const torch::Tensor x = (torch::randn({3, 37, 5}) * 3).to(dtype);
    EXPECT_TRUE(BitwiseEqual(kernels::gelu(x), torch::gelu(x))) << c10::toString(dtype);
  }
}

TEST(Gelu, GradientAgreesWithDoubleAndWithLibTorch) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const int64_t size : {1, 15, 16, 17, 37, 100003}) {  // 100,003: over 3 parallel grains, a tail of 3
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << ", " << size << " elements");
      torch::manual_seed(size);
      const torch::Tensor x = (torch::randn({size}) * 3).to(dtype), dy = torch::randn({size}).to(dtype);
      const torch::Tensor ours = our_gradient(dy, x);
      ASSERT_EQ(ours.scalar_type(), dtype);
      // fp32: erf's approximation (1.5e-7) and a few roundings; bf16: the result rounded once.
      EXPECT_LT(error_in_epsilons(ours, reference_gradient(dy, x), dtype), dtype == torch::kFloat ? 16 : 1);
      EXPECT_LT(error_in_epsilons(ours, at::gelu_backward(dy, x), dtype), dtype == torch::kFloat ? 16 : 1.01);
      EXPECT_TRUE(BitwiseEqual(our_gradient(dy, x), ours)) << "a second call answered otherwise";
    }
  }
}

TEST(Gelu, GradientKeepsADenseLayoutAndTakesAnyOther) {
  const torch::Tensor x = torch::randn({2, 3, 5, 7}).contiguous(at::MemoryFormat::ChannelsLast);
  const torch::Tensor dy = torch::randn({2, 3, 5, 7}).contiguous(at::MemoryFormat::ChannelsLast);
  const torch::Tensor channels_last = our_gradient(dy, x);
  EXPECT_EQ(channels_last.strides(), x.strides());
  const torch::Tensor expected = reference_gradient(dy, x);
  EXPECT_LT(error_in_epsilons(channels_last, expected, torch::kFloat), 16);
  // dy contiguous, x channels_last: neither layout for both, contiguous copies.
  EXPECT_LT(error_in_epsilons(our_gradient(dy.contiguous(), x), expected, torch::kFloat), 16);
  // An expanded upstream gradient (a sum's), and a transposed input.
  const torch::Tensor m = torch::randn({7, 19}).t();
  const torch::Tensor ones = torch::ones({1, 1}).expand({19, 7});
  EXPECT_LT(error_in_epsilons(our_gradient(ones, m), reference_gradient(ones, m), torch::kFloat), 16);
}

TEST(Gelu, NonFiniteValuesGoWhereLibTorchsGradientPutsThem) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    const torch::Tensor x = torch::tensor({nan, inf, -inf, 0.0, 1.0, -1.0, 30.0, -30.0}).to(dtype);
    const torch::Tensor dy = torch::tensor({1.0, 1.0, 1.0, nan, inf, -inf, 2.0, 2.0}).to(dtype);
    const torch::Tensor ours = our_gradient(dy, x), theirs = at::gelu_backward(dy, x);
    EXPECT_TRUE(torch::equal(ours.isnan(), theirs.isnan())) << c10::toString(dtype);
    EXPECT_TRUE(torch::equal(ours.isposinf(), theirs.isposinf())) << c10::toString(dtype);
    EXPECT_TRUE(torch::equal(ours.isneginf(), theirs.isneginf())) << c10::toString(dtype);
  }
}

TEST(Gelu, UnderCreateGraphTheGradientIsDifferentiable) {
  const torch::Tensor x = torch::randn({11}, torch::kDouble).requires_grad_();
  const torch::Tensor dx = torch::autograd::grad({kernels::gelu(x).sum()}, {x}, {}, true, true)[0];
  const torch::Tensor second = torch::autograd::grad({dx.sum()}, {x})[0];
  const torch::Tensor v = x.detach().requires_grad_();
  const torch::Tensor rdx = torch::autograd::grad({torch::gelu(v).sum()}, {v}, {}, true, true)[0];
  EXPECT_TRUE(torch::allclose(second, torch::autograd::grad({rdx.sum()}, {v})[0], 1e-12, 1e-12));
}

}  // namespace
}  // namespace gelu_test
