// kernels::favor_features and favor_contraction beyond the contract's random inputs
// (invariants_test): maxima held by several positions (zero rows, whose features all tie, and
// a whole (batch, head) of them) get amax's gradient, split evenly, in double against autograd of
// LibTorch's ops; features over leading dimensions of any number; causal rows that read earlier
// positions only; every key masked gives zero rows; bad arguments are refused naming them.
#include "afterburner/kernels/favor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>

#include "afterburner/core/error.h"
#include "testing.h"

// A namespace of its own: the tests' unity build puts this file beside others.
namespace favor_test {
namespace {

namespace kernels = afterburner::kernels;
using afterburner::testing::Contains;
using afterburner::testing::error_message;
using kernels::FavorFeatureMap;

// The features in LibTorch's ops (Performer's softmax map; amax's gradient splits among ties).
torch::Tensor reference_features(const torch::Tensor& x, const torch::Tensor& projection, FavorFeatureMap map) {
  const double scale = std::pow(static_cast<double>(x.size(-1)), -0.25);
  const torch::Tensor dash = torch::matmul(x * scale, projection.t());
  torch::Tensor stabilizer = dash.amax(-1, true);
  if (map == FavorFeatureMap::softmax_key) stabilizer = stabilizer.amax(-2, true);
  return torch::exp(dash - (x * scale).square().sum(-1, true) / 2 - stabilizer) + 1e-5;
}

std::vector<torch::Tensor> value_and_gradients(const std::function<torch::Tensor()>& f, const torch::Tensor& x,
                                               const torch::Tensor& projection, const torch::Tensor& upstream) {
  const torch::Tensor out = f();
  const auto grads = torch::autograd::grad({out}, {x, projection}, {upstream});
  return {out.detach(), grads[0], grads[1]};
}

TEST(FavorFeatures, TiedMaximaGetAmaxsGradientSplitEvenly) {
  for (const FavorFeatureMap map : {FavorFeatureMap::softmax_query, FavorFeatureMap::softmax_key}) {
    SCOPED_TRACE(map == FavorFeatureMap::softmax_query ? "queries" : "keys");
    torch::manual_seed(3);
    torch::Tensor values = torch::randn({2, 3, 6, 8}, torch::kDouble);
    values[0][1].zero_();           // a whole (batch, head): every row's and the group's maximum tie
    values[1][2][4].zero_();        // one zero row among others
    values[1][0].select(-1, 0) = 0;
    const torch::Tensor x = values.requires_grad_();
    // Two equal projection rows: their products tie in every row.
    torch::Tensor p = torch::randn({5, 8}, torch::kDouble);
    p[3] = p[1];
    const torch::Tensor projection = p.requires_grad_();
    const torch::Tensor upstream = torch::randn({2, 3, 6, 5}, torch::kDouble);
    const auto ours = value_and_gradients([&] { return kernels::favor_features(x, projection, map); }, x, projection,
                                          upstream);
    const auto expected = value_and_gradients([&] { return reference_features(x, projection, map); }, x, projection,
                                              upstream);
    for (std::size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::allclose(ours[i], expected[i], 1e-12, 1e-12)) << "value, dx, dprojection: " << i;
    }
  }
}

// x anti-parallel to every projection row: the row's maximum x^ P^T is far below 0 and the exponent
// subtracts |x^|^2 / 2 + s = -88.7 (x^ = -p, |p|^2 = 177.4). 17 features: a tail after the 16
// lanes, whose unused lanes must not bring exp(88.7) (past float's range: inf) into the row's sum.
TEST(FavorFeatures, ARowFarBelowZeroKeepsFiniteGradients) {
  const double component = std::sqrt(177.4 / 16);
  const torch::Tensor x = torch::full({1, 2, 16}, -2 * component).requires_grad_();  // x^ = x 16^-1/4 = x / 2
  const torch::Tensor projection = torch::full({17, 16}, component);
  const torch::Tensor upstream = torch::randn({1, 2, 17});
  const torch::Tensor dx = torch::autograd::grad({kernels::favor_features(x, projection, FavorFeatureMap::softmax_query)},
                                                 {x}, {upstream})[0];
  const torch::Tensor x64 = x.detach().to(torch::kDouble).requires_grad_();
  const torch::Tensor expected = torch::autograd::grad(
      {reference_features(x64, projection.to(torch::kDouble), FavorFeatureMap::softmax_query)}, {x64},
      {upstream.to(torch::kDouble)})[0];
  EXPECT_TRUE(dx.isfinite().all().item<bool>()) << dx;
  EXPECT_TRUE(torch::allclose(dx.to(torch::kDouble), expected, 1e-6, 1e-6)) << dx << expected;
}

TEST(FavorFeatures, TakeAnyLeadingDimensionsAndNoGradMode) {
  torch::manual_seed(4);
  const torch::Tensor projection = torch::randn({7, 4}, torch::kDouble);
  for (const auto& sizes : std::vector<std::vector<int64_t>>{{5, 4}, {3, 5, 4}, {2, 1, 3, 5, 4}}) {
    const torch::Tensor x = torch::randn(sizes, torch::kDouble);
    for (const FavorFeatureMap map : {FavorFeatureMap::softmax_query, FavorFeatureMap::softmax_key}) {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::allclose(kernels::favor_features(x, projection, map), reference_features(x, projection, map),
                                  1e-13, 1e-13))
          << c10::IntArrayRef(sizes);
    }
  }
}

// Causal: row i reads keys and values j <= i only, across the 128-position blocks and within them.
TEST(FavorContraction, CausalRowsReadOnlyEarlierPositions) {
  torch::manual_seed(5);
  const torch::Tensor qf = torch::rand({2, 300, 6}, torch::kDouble).add_(0.1);
  const torch::Tensor kf = torch::rand({2, 300, 6}, torch::kDouble).add_(0.1).requires_grad_();
  const torch::Tensor v = torch::randn({2, 300, 3}, torch::kDouble).requires_grad_();
  const torch::Tensor out = kernels::favor_contraction(qf, kf, v, /*causal=*/true);
  for (const int64_t changed : {299, 200, 130, 127, 5}) {
    const torch::Tensor later_v = v.detach().clone(), later_k = kf.detach().clone();
    later_v.narrow(1, changed, 300 - changed).mul_(3).add_(1);
    later_k.narrow(1, changed, 300 - changed).mul_(2);
    const torch::Tensor again = kernels::favor_contraction(qf, later_k, later_v, true);
    EXPECT_TRUE(torch::allclose(again.narrow(1, 0, changed), out.narrow(1, 0, changed).detach(), 1e-14, 1e-14))
        << "rows before " << changed;
    EXPECT_FALSE(torch::allclose(again.narrow(1, changed, 1), out.narrow(1, changed, 1).detach())) << changed;
  }
  // The gradient of the first 131 rows reaches no later key or value.
  const auto grads = torch::autograd::grad({out.narrow(1, 0, 131).sum()}, {kf, v});
  EXPECT_TRUE(torch::equal(grads[0].narrow(1, 131, 169), torch::zeros({2, 169, 6}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(grads[1].narrow(1, 131, 169), torch::zeros({2, 169, 3}, torch::kDouble)));
  EXPECT_GT(grads[1].narrow(1, 0, 131).abs().sum().item<double>(), 0);
}

TEST(FavorContraction, EveryKeyMaskedGivesZeroRowsAndGradients) {
  const torch::Tensor qf = torch::rand({2, 4, 3}, torch::kDouble).add_(0.1).requires_grad_();
  const torch::Tensor kf = torch::zeros({2, 5, 3}, torch::kDouble).requires_grad_();
  const torch::Tensor v = torch::randn({2, 5, 6}, torch::kDouble).requires_grad_();
  const torch::Tensor out = kernels::favor_contraction(qf, kf, v);
  EXPECT_TRUE(torch::equal(out, torch::zeros({2, 4, 6}, torch::kDouble)));
  const auto grads = torch::autograd::grad({out}, {qf, kf, v}, {torch::randn({2, 4, 6}, torch::kDouble)});
  EXPECT_TRUE(torch::equal(grads[0], torch::zeros_like(qf)));
  EXPECT_TRUE(torch::equal(grads[2], torch::zeros_like(v)));
  EXPECT_TRUE(grads[1].isfinite().all().item<bool>());
}

TEST(Favor, RefusesBadArgumentsNamingThem) {
  const torch::Tensor x = torch::randn({2, 5, 8}), projection = torch::randn({16, 8});
  const auto expect_refused = [](const std::function<void()>& call, const std::string& named) {
    EXPECT_TRUE(Contains(error_message<afterburner::UsageError>(call), named));
  };
  const auto softmax = FavorFeatureMap::softmax_query;
  expect_refused([&] { kernels::favor_features(x.to(torch::kBFloat16), projection, softmax); }, "favor_features x");
  expect_refused([&] { kernels::favor_features(torch::randn({8}), projection, softmax); }, "favor_features x");
  expect_refused([&] { kernels::favor_features(x, torch::randn({16, 7}), softmax); }, "favor_features projection");
  expect_refused([&] { kernels::favor_features(x, torch::randn({0, 8}), softmax); }, "favor_features projection");
  expect_refused([&] { kernels::favor_features(torch::randn({2, 5, 0}), torch::randn({16, 0}), softmax); },
                 "favor_features x");
  expect_refused([&] { kernels::favor_features(x, projection.to(torch::kDouble), softmax); },
                 "favor_features projection");
  const torch::Tensor qf = torch::rand({2, 5, 16}), kf = torch::rand({2, 7, 16}), v = torch::randn({2, 7, 4});
  expect_refused([&] { kernels::favor_contraction(qf, torch::rand({2, 7, 15}), v); }, "favor_contraction key_features");
  expect_refused([&] { kernels::favor_contraction(qf, torch::rand({3, 7, 16}), v); }, "favor_contraction key_features");
  expect_refused([&] { kernels::favor_contraction(qf, kf, torch::randn({2, 6, 4})); }, "favor_contraction values");
  expect_refused([&] { kernels::favor_contraction(qf.to(torch::kInt), kf, v); }, "favor_contraction query_features");
  expect_refused([&] { kernels::favor_contraction(qf, kf, v, /*causal=*/true); }, "causal: as many keys as queries");
}

}  // namespace
}  // namespace favor_test
