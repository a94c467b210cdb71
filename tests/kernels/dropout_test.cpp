// kernels::dropout against at::dropout from the same seed: the same values bit for bit, the same
// gradients, and the default CPU generator left in the same state (the draws that follow alike),
// in fp32, bf16 and double, at sizes within one MT19937 state (624 draws) and across many, for
// transposed inputs and over consecutive calls; the cases it hands to at::dropout; the kernel
// contract (input unchanged, a fresh output, NaN and infinities where at::dropout puts them).
#include "afterburner/kernels/dropout.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "invariants.h"

// A namespace of its own: the tests' unity build puts this file beside others.
namespace dropout_test {
namespace {

namespace kernels = afterburner::kernels;
using afterburner::testing::BitwiseEqual;

struct Run {
  std::vector<torch::Tensor> outputs, grads;
  torch::Tensor after;  // what the generator draws next
};

// `calls` dropouts of x in a row from seed 7, through `op`, each differentiated by a fixed upstream.
template <typename Op>
Run run(const Op& op, const torch::Tensor& x, double p, int calls) {
  torch::manual_seed(7);
  Run r;
  for (int i = 0; i < calls; ++i) {
    const torch::Tensor input = x.detach().requires_grad_();
    const torch::Tensor out = op(input, p, true);
    r.grads.push_back(torch::autograd::grad({out}, {input}, {torch::full_like(out, 0.75)})[0]);
    r.outputs.push_back(out.detach());
  }
  r.after = torch::rand({5}, torch::kDouble);
  return r;
}

void expect_same_as_libtorch(const torch::Tensor& x, double p, int calls = 3) {
  const Run ours = run([](const torch::Tensor& t, double q, bool train) { return kernels::dropout(t, q, train); }, x, p,
                       calls);
  const Run theirs = run([](const torch::Tensor& t, double q, bool train) { return at::dropout(t, q, train); }, x, p,
                         calls);
  for (int i = 0; i < calls; ++i) {
    EXPECT_TRUE(BitwiseEqual(ours.outputs[i], theirs.outputs[i])) << "output of call " << i;
    EXPECT_TRUE(BitwiseEqual(ours.grads[i], theirs.grads[i])) << "gradient of call " << i;
  }
  EXPECT_TRUE(torch::equal(ours.after, theirs.after)) << "the generator's next draws";
}

TEST(Dropout, DrawsAsLibTorchBitForBit) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
    for (const int64_t size : {1, 7, 311, 312, 313, 5000, 100003}) {  // 312 elements take one state's 624 draws
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << ", " << size << " elements");
      torch::manual_seed(size);
      expect_same_as_libtorch(torch::randn({size}).to(dtype), 0.1);
    }
  }
}

TEST(Dropout, DrawsAsLibTorchForEveryProbabilityAndLayout) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({6, 33, 17});
  for (const double p : {0.5, 0.9, 1e-9, 1 - 1e-9}) {
    SCOPED_TRACE(::testing::Message() << "p " << p);
    expect_same_as_libtorch(x, p);
    expect_same_as_libtorch(x.transpose(0, 2), p);  // noise drawn in a contiguous tensor's order
    expect_same_as_libtorch(x.to(torch::kBFloat16).transpose(1, 2), p);
  }
}

// Evaluation, p 0 and p 1, other dtypes: at::dropout's own results and errors (p 0 and
// evaluation return the input itself; LibTorch 1.13 draws no Bernoulli values in fp16 on the CPU).
TEST(Dropout, HandsTheOtherCasesToLibTorch) {
  const torch::Tensor x = torch::randn({4, 5});
  EXPECT_TRUE(kernels::dropout(x, 0.3, false).is_same(x));
  EXPECT_TRUE(kernels::dropout(x, 0.0, true).is_same(x));
  EXPECT_TRUE(torch::equal(kernels::dropout(x, 1.0, true), torch::zeros_like(x)));
  EXPECT_THROW(kernels::dropout(torch::randn({9}).to(torch::kHalf), 0.2, true), c10::Error);
  EXPECT_THROW(kernels::dropout(x, 1.5, true), c10::Error);
  EXPECT_EQ(kernels::dropout(torch::randn({0, 3}), 0.2, true).numel(), 0);
}

// The input stays as it was and the output is a tensor of its own; NaN and infinities come out
// where at::dropout's product puts them (a dropped infinity is NaN: inf * 0).
TEST(Dropout, KeepsTheKernelContract) {
  torch::manual_seed(4);
  torch::Tensor x = torch::randn({1000});
  x[3] = NAN;
  x[10] = INFINITY;
  x[11] = -INFINITY;
  const torch::Tensor before = x.clone();
  torch::manual_seed(9);
  const torch::Tensor ours = kernels::dropout(x, 0.5, true);
  torch::manual_seed(9);
  const torch::Tensor theirs = at::dropout(x, 0.5, true);
  EXPECT_TRUE(BitwiseEqual(x, before));
  EXPECT_NE(ours.data_ptr(), x.data_ptr());
  EXPECT_TRUE(BitwiseEqual(ours, theirs));
}

// The op as TorchScript calls it, and through autograd's recorded product.
TEST(Dropout, IsTheDispatcherOpAfterburnerDropout) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("afterburner::dropout", "");
  const torch::Tensor x = torch::randn({50});
  torch::manual_seed(2);
  const torch::Tensor through_op = op.typed<torch::Tensor(const torch::Tensor&, double, bool)>().call(x, 0.25, true);
  torch::manual_seed(2);
  EXPECT_TRUE(BitwiseEqual(through_op, at::dropout(x, 0.25, true)));
}

}  // namespace
}  // namespace dropout_test
