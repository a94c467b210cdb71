#include "afterburner/sketch/sklinear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <tuple>
#include <vector>

#include "afterburner/core/error.h"
#include "reference.h"
#include "testing.h"

namespace afterburner::sketch {
namespace {

struct Shape {
  int64_t batch, in, out, rank, terms;
};

// Forward and the gradients of input, S1s, S2s and bias against the definition in double, for
// the same upstream gradient; the U buffers get none.
void expect_matches_definition(const Shape& s, bool with_bias, bool strided_input) {
  torch::manual_seed(7);
  SKLinear layer(SKLinearOptions(s.in, s.out).terms(s.terms).rank(s.rank).bias(with_bias));
  torch::Tensor x = strided_input ? torch::randn({s.in, s.batch}).t() : torch::randn({s.batch, s.in});
  ASSERT_EQ(x.is_contiguous(), !strided_input);
  x.requires_grad_();
  const torch::Tensor y = layer(x);
  const torch::Tensor upstream = torch::randn_like(y);
  std::vector<torch::Tensor> trained{x, layer->S1s, layer->S2s};
  if (with_bias) trained.push_back(layer->bias);
  const auto grads = torch::autograd::grad({y}, trained, {upstream});

  std::vector<torch::Tensor> in_double;
  for (const auto& t : trained) in_double.push_back(t.detach().to(torch::kDouble).requires_grad_());
  const torch::Tensor expected =
      reference::sklinear(in_double[0], in_double[1], in_double[2], layer->U1s.to(torch::kDouble), layer->U2s.to(torch::kDouble),
                with_bias ? in_double[3] : torch::Tensor());
  const auto expected_grads = torch::autograd::grad({expected}, in_double, {upstream.to(torch::kDouble)});

  EXPECT_LE(reference::relative_error(y, expected), 1e-4);
  for (size_t i = 0; i < trained.size(); ++i) EXPECT_LE(reference::relative_error(grads[i], expected_grads[i]), 1e-4) << "gradient " << i;
  EXPECT_FALSE(layer->U1s.requires_grad());
  EXPECT_FALSE(layer->U2s.requires_grad());
}

class SKLinearShapes : public ::testing::TestWithParam<std::tuple<Shape, bool, bool>> {};

TEST_P(SKLinearShapes, ForwardAndGradientsMatchTheDefinitionInDouble) {
  const auto& [shape, with_bias, strided] = GetParam();
  expect_matches_definition(shape, with_bias, strided);
}

INSTANTIATE_TEST_SUITE_P(Acceptance, SKLinearShapes,
                         ::testing::Combine(::testing::Values(Shape{16, 1024, 768, 16, 2}, Shape{16, 768, 1024, 64, 2},
                                                              Shape{32, 1024, 2048, 128, 1}, Shape{64, 512, 512, 32, 3}),
                                            ::testing::Bool(), ::testing::Bool()));

// 2Lk = 30 and 60 run padded to 32 and 64 inner columns; 2Lk = 14 and 34 do not.
INSTANTIATE_TEST_SUITE_P(PaddedWidths, SKLinearShapes,
                         ::testing::Combine(::testing::Values(Shape{8, 300, 200, 15, 1}, Shape{8, 300, 200, 15, 2},
                                                              Shape{8, 300, 200, 7, 1}, Shape{8, 300, 200, 17, 1}),
                                            ::testing::Values(true), ::testing::Bool()));

TEST(SKLinear, ShapesAndNamesOfParametersAndBuffers) {
  SKLinear layer(SKLinearOptions(20, 12).terms(3).rank(4));
  EXPECT_EQ(layer->S1s.sizes(), (std::vector<int64_t>{3, 20, 4}));
  EXPECT_EQ(layer->S2s.sizes(), (std::vector<int64_t>{3, 4, 12}));
  EXPECT_EQ(layer->U1s.sizes(), (std::vector<int64_t>{3, 4, 12}));
  EXPECT_EQ(layer->U2s.sizes(), (std::vector<int64_t>{3, 20, 4}));
  EXPECT_EQ(layer->named_parameters().keys(), (std::vector<std::string>{"S1s", "S2s", "bias"}));
  EXPECT_EQ(layer->named_buffers().keys(), (std::vector<std::string>{"U1s", "U2s"}));
  EXPECT_TRUE(torch::allclose(layer->U1s.abs(), torch::full({3, 4, 12}, 0.5)));  // +-1/sqrt(4)
  EXPECT_EQ(layer(torch::randn({2, 5, 20})).sizes(), (std::vector<int64_t>{2, 5, 12}));  // leading dims kept
}

TEST(SKLinear, InitialisedFromADenseWeight) {
  torch::manual_seed(3);
  const torch::Tensor dense = torch::randn({12, 20});  // torch::nn::Linear's [d_out, d_in]
  SKLinear layer(SKLinearOptions(20, 12).terms(2).rank(4), dense);
  const torch::Tensor w = dense.t();
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(torch::allclose(layer->S1s[i], w.mm(layer->U1s[i].t()), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(layer->S2s[i], layer->U2s[i].t().mm(w), 1e-5, 1e-5));
  }
}

// Over many independent layers initialised from the same W, the output averages to x W (bias
// off): each term is unbiased, E[U^T U] = I. Each layer's squared error stays within the
// bound 2 ||W||_F^2 ||x||^2 / k on average.
TEST(SKLinear, AtInitialisationAnUnbiasedEstimateOfTheDenseLayer) {
  torch::manual_seed(11);
  const int64_t in = 16, out = 12, rank = 4, layers = 3000;
  const torch::Tensor dense = torch::randn({out, in}, torch::kDouble).to(torch::kFloat);
  const torch::Tensor x = torch::randn({1, in});
  const torch::Tensor exact = x.mm(dense.t()).to(torch::kDouble);
  torch::Tensor sum = torch::zeros_like(exact);
  double squared_error = 0;
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < layers; ++l) {
    SKLinear layer(SKLinearOptions(in, out).terms(1).rank(rank).bias(false), dense);
    const torch::Tensor y = layer(x).to(torch::kDouble);
    sum += y;
    squared_error += (y - exact).pow(2).sum().item<double>();
  }
  const double bound = 2 * dense.pow(2).sum().item<double>() * x.pow(2).sum().item<double>() / rank;
  EXPECT_LE(squared_error / layers, bound);
  const double mean_error = (sum / layers - exact).norm().item<double>();
  EXPECT_LE(mean_error, 5 * std::sqrt(bound / layers)) << "the average does not converge to x W";
}

TEST(SKLinear, BadSizesAndInputsNameTheField) {
  using testing::Contains;
  using testing::error_message;
  EXPECT_TRUE(Contains(error_message<UsageError>([] { SKLinear(SKLinearOptions(8, 8).rank(0)); }),
                       "SKLinear rank: must be at least 1, got 0"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { SKLinear(SKLinearOptions(8, 6), torch::randn({8, 6})); }),
                       "SKLinear dense_weight: expected [6, 8]"));
  SKLinear layer(SKLinearOptions(8, 6).rank(1));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { layer(torch::randn({2, 7})); }),
                       "SKLinear input: expected [..., 8], got [2, 7]"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { SKLinear(SKLinearOptions(8, 8).dropout(-0.5)); }),
                       "SKLinear dropout: must be between 0 and 1, got -0.5"));
}

// relu and dropout as options: what the layer followed by LibTorch's ReLU and Dropout computes,
// from the same seed, in training (inputs of 3 dimensions) and in evaluation, in inference too.
TEST(SKLinear, ReluAndDropoutOptionsAsLibTorchsLayersAfterIt) {
  torch::manual_seed(8);
  SKLinear fused(SKLinearOptions(24, 18).terms(2).rank(3).relu(true).dropout(0.4));
  SKLinear plain(SKLinearOptions(24, 18).terms(2).rank(3));
  {
    const torch::NoGradGuard no_grad;
    for (const auto& item : fused->named_parameters()) plain->named_parameters()[item.key()].copy_(item.value());
    for (const auto& item : fused->named_buffers()) plain->named_buffers()[item.key()].copy_(item.value());
  }
  const torch::Tensor x = torch::randn({2, 5, 24});
  auto unfused = [&](const torch::Tensor& input) {
    return torch::dropout(torch::relu(plain(input)), 0.4, plain->is_training());
  };
  for (const bool training : {true, false}) {
    fused->train(training);
    plain->train(training);
    torch::manual_seed(9);
    const torch::Tensor ours = fused(x);
    torch::manual_seed(9);
    EXPECT_TRUE(torch::equal(ours, unfused(x))) << "training " << training;
    if (!training) {
      const torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(fused(x), unfused(x)));
    }
  }
  std::ostringstream printed;
  fused->pretty_print(printed);
  EXPECT_TRUE(testing::Contains(printed.str(), "relu=true, dropout=0.4)"));
}

// The layer's answer made from its tensors as they are now, in double.
torch::Tensor definition(const SKLinear& layer, const torch::Tensor& x) {
  auto d = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };
  return reference::sklinear(d(x), d(layer->S1s), d(layer->S2s), d(layer->U1s), d(layer->U2s), d(layer->bias));
}

// Without gradients the layer reuses its GEMM operands: the answers stay those of its tensors as
// they are at each call, through in-place updates, loaded state, a swapped parameter and modes.
TEST(SKLinear, OperandsKeptForInferenceFollowEveryChangeOfTheTensors) {
  torch::manual_seed(11);
  SKLinear layer(SKLinearOptions(96, 40).terms(2).rank(5));
  const torch::Tensor x = torch::randn({7, 96});
  torch::NoGradGuard no_grad;
  const torch::Tensor first = layer(x);
  EXPECT_LE(reference::relative_error(first, definition(layer, x)), 1e-5);
  EXPECT_TRUE(torch::equal(layer(x), first));  // a second call, from the kept operands

  layer->S1s.mul_(-2);  // an optimizer's in-place step
  EXPECT_LE(reference::relative_error(layer(x), definition(layer, x)), 1e-5);
  layer->S2s.copy_(torch::randn_like(layer->S2s));  // load_state_dict's copy
  EXPECT_LE(reference::relative_error(layer(x), definition(layer, x)), 1e-5);
  layer->U2s.neg_();  // a buffer changes too
  EXPECT_LE(reference::relative_error(layer(x), definition(layer, x)), 1e-5);
  layer->S1s.set_data(torch::randn_like(layer->S1s));  // same tensor, other memory
  EXPECT_LE(reference::relative_error(layer(x), definition(layer, x)), 1e-5);
  {
    c10::InferenceMode inference;
    EXPECT_LE(reference::relative_error(layer(x), definition(layer, x)), 1e-5);
  }
  SKLinear copy(std::dynamic_pointer_cast<SKLinearImpl>(layer->clone()));
  copy->S2s.zero_();
  EXPECT_LE(reference::relative_error(copy(x), definition(copy, x)), 1e-5);
  EXPECT_LE(reference::relative_error(layer(x), definition(layer, x)), 1e-5);  // the original's own
}

// Operands kept under inference mode are inference tensors; a later call that records a graph
// (the input wants a gradient) must not save them.
TEST(SKLinear, OperandsKeptInInferenceModeAreNotSavedForBackward) {
  torch::manual_seed(12);
  SKLinear layer(SKLinearOptions(32, 16).terms(1).rank(4));
  for (auto& parameter : layer->parameters()) parameter.requires_grad_(false);
  const torch::Tensor x = torch::randn({3, 32});
  torch::Tensor expected;
  {
    c10::InferenceMode inference;
    expected = layer(x);
  }
  const torch::Tensor input = x.clone().requires_grad_();
  const torch::Tensor y = layer(input);
  EXPECT_TRUE(torch::equal(y.detach(), expected));
  const torch::Tensor grad = torch::autograd::grad({y.sum()}, {input})[0];
  const torch::Tensor dense = definition(layer, torch::eye(32)) - definition(layer, torch::zeros({1, 32}));
  EXPECT_LE(reference::relative_error(grad, dense.sum(1).expand({3, 32})), 1e-5);
}

TEST(SKLinear, SavingNothingIsDetected) {
  EXPECT_FALSE(sketch_saves_nothing(SKLinearOptions(1024, 768).terms(2).rank(16)));
  EXPECT_TRUE(sketch_saves_nothing(SKLinearOptions(64, 64).terms(2).rank(16)));
}

}  // namespace
}  // namespace afterburner::sketch
