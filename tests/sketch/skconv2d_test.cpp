#include "afterburner/sketch/skconv2d.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "afterburner/core/error.h"
#include "reference.h"
#include "testing.h"

namespace afterburner::sketch {
namespace {

// S1_i[kappa, c, h, w] = sum_o K[o, c, h, w] U1_i[kappa, o], in double.
torch::Tensor initial_s1(const torch::Tensor& dense, const torch::Tensor& u1) {
  const torch::Tensor s1 = torch::einsum("iko,ochw->ikchw", {u1.to(torch::kDouble), dense.to(torch::kDouble)});
  return s1.reshape({-1, dense.size(1), dense.size(2), dense.size(3)});
}

using reference::relative_error;

struct Geometry {
  int64_t batch, in, out, height, width, kernel, stride, padding, rank, terms;
};

SKConv2dOptions options_of(const Geometry& g, bool with_bias) {
  return SKConv2dOptions(g.in, g.out, g.kernel)
      .stride(g.stride)
      .padding(g.padding)
      .rank(g.rank)
      .terms(g.terms)
      .bias(with_bias);
}

enum class Layout { contiguous, channels_last, transposed };

const char* name_of(Layout layout) {
  switch (layout) {
    case Layout::channels_last:
      return "channels_last";
    case Layout::transposed:
      return "transposed";
    case Layout::contiguous:
      break;
  }
  return "contiguous";
}

torch::Tensor input_in(Layout layout, const Geometry& g) {
  switch (layout) {
    case Layout::channels_last:
      return torch::randn({g.batch, g.in, g.height, g.width}).contiguous(torch::MemoryFormat::ChannelsLast);
    case Layout::transposed:
      return torch::randn({g.batch, g.in, g.width, g.height}).transpose(2, 3);  // neither layout
    case Layout::contiguous:
      break;
  }
  return torch::randn({g.batch, g.in, g.height, g.width});
}

// Forward and the gradients of input, S1s and bias against the definition in double, for the
// same upstream gradient; U1s gets none.
void expect_matches_definition(const Geometry& g, bool with_bias, Layout layout) {
  torch::manual_seed(7);
  SKConv2d layer(options_of(g, with_bias));
  torch::Tensor x = input_in(layout, g);
  ASSERT_EQ(x.is_contiguous(), layout == Layout::contiguous);
  x.requires_grad_();
  const torch::Tensor y = layer(x);
  const torch::Tensor upstream = torch::randn_like(y);
  std::vector<torch::Tensor> trained{x, layer->S1s};
  if (with_bias) trained.push_back(layer->bias);
  const auto grads = torch::autograd::grad({y}, trained, {upstream});

  std::vector<torch::Tensor> in_double;
  for (const auto& t : trained) in_double.push_back(t.detach().to(torch::kDouble).requires_grad_());
  const torch::Tensor expected =
      reference::skconv2d(in_double[0], in_double[1], layer->U1s.to(torch::kDouble),
                          with_bias ? in_double[2] : torch::Tensor(), layer->options.stride(), layer->options.padding());
  const auto expected_grads = torch::autograd::grad({expected}, in_double, {upstream.to(torch::kDouble)});

  ASSERT_EQ(y.sizes(), expected.sizes());
  EXPECT_LE(relative_error(y, expected), 1e-4);
  for (size_t i = 0; i < trained.size(); ++i) EXPECT_LE(relative_error(grads[i], expected_grads[i]), 1e-4) << "gradient " << i;
  EXPECT_FALSE(layer->U1s.requires_grad());
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<Geometry, bool, Layout>>& info) {
  const auto& [g, with_bias, layout] = info.param;
  return fmt::format("in{}_out{}_kernel{}_stride{}_rank{}_terms{}_{}_{}", g.in, g.out, g.kernel, g.stride, g.rank,
                     g.terms, with_bias ? "bias" : "nobias", name_of(layout));
}

class SKConv2dShapes : public ::testing::TestWithParam<std::tuple<Geometry, bool, Layout>> {};

TEST_P(SKConv2dShapes, ForwardAndGradientsMatchTheDefinitionInDouble) {
  const auto& [geometry, with_bias, layout] = GetParam();
  expect_matches_definition(geometry, with_bias, layout);
}

INSTANTIATE_TEST_SUITE_P(Acceptance, SKConv2dShapes,
                         ::testing::Combine(::testing::Values(Geometry{2, 3, 8, 20, 20, 5, 2, 2, 4, 5},
                                                              Geometry{1, 3, 4, 10, 10, 3, 1, 2, 2, 3}),
                                            ::testing::Bool(),
                                            ::testing::Values(Layout::contiguous, Layout::channels_last,
                                                              Layout::transposed)),
                         test_name);

TEST(SKConv2d, ShapesAndNamesOfParametersAndBuffers) {
  const auto options = SKConv2dOptions(3, 16, {3, 5}).stride({2, 1}).padding({1, 2}).terms(3).rank(2);
  SKConv2d layer(options);
  EXPECT_EQ(layer->S1s.sizes(), (std::vector<int64_t>{12, 3, 3, 5}));
  EXPECT_EQ(layer->U1s.sizes(), (std::vector<int64_t>{6, 2, 16}));
  EXPECT_EQ(layer->named_parameters().keys(), (std::vector<std::string>{"S1s", "bias"}));
  EXPECT_EQ(layer->named_buffers().keys(), (std::vector<std::string>{"U1s"}));
  EXPECT_TRUE(torch::allclose(layer->U1s.abs(), torch::full({6, 2, 16}, 1 / std::sqrt(2.0))));
  torch::nn::Conv2d dense(torch::nn::Conv2dOptions(3, 16, {3, 5}).stride({2, 1}).padding({1, 2}));
  const torch::Tensor x = torch::randn({2, 3, 11, 9});
  EXPECT_EQ(layer(x).sizes(), dense(x).sizes());
  EXPECT_EQ(SKConv2d(SKConv2dOptions(3, 16, 3).bias(false))->named_parameters().keys(),
            (std::vector<std::string>{"S1s"}));
}

TEST(SKConv2d, InitialisedFromADenseWeight) {
  torch::manual_seed(3);
  const torch::Tensor dense = torch::randn({6, 4, 3, 2});  // torch::nn::Conv2d's [C_out, C_in, Kh, Kw]
  SKConv2d layer(SKConv2dOptions(4, 6, {3, 2}).terms(2).rank(3), dense);
  EXPECT_TRUE(torch::allclose(layer->S1s.to(torch::kDouble), initial_s1(dense, layer->U1s), 1e-5, 1e-5));
}

// Without a dense weight the layer draws K and b as torch::nn::Conv2d does: seeded alike, the
// two draw the same ones.
TEST(SKConv2d, DrawsTheDenseKernelAndBiasAsConv2dDoes) {
  torch::manual_seed(5);
  torch::nn::Conv2d dense(torch::nn::Conv2dOptions(4, 6, 3));
  torch::manual_seed(5);
  SKConv2d layer(SKConv2dOptions(4, 6, 3).rank(2));
  EXPECT_TRUE(torch::equal(layer->bias, dense->bias));
  EXPECT_TRUE(torch::allclose(layer->S1s.to(torch::kDouble), initial_s1(dense->weight, layer->U1s), 1e-5, 1e-5));
}

// Over many independent layers initialised from the same K, the output averages to the dense
// conv2d(X, K) + b. Per layer, with Z = conv2d(X, K): the diagonal of U1_i^T U1_i is exactly 1
// and its off-diagonal entries are uncorrelated with variance 1/k, so the squared error has
// expectation e = (C_out - 1) ||Z||^2 / (2Lk) exactly; the mean of n layers' errors has expected
// squared norm e / n. Tolerances: the average squared error within 15% of e, the norm of the
// mean error within 3 sqrt(e / n).
TEST(SKConv2d, AtInitialisationAnUnbiasedEstimateOfTheDenseConvolution) {
  torch::manual_seed(11);
  const int64_t in = 2, out = 6, rank = 2, terms = 1, layers = 2000;
  const torch::Tensor dense = torch::randn({out, in, 3, 3});
  const torch::Tensor x = torch::randn({1, in, 5, 5});
  const torch::Tensor z = torch::conv2d(x.to(torch::kDouble), dense.to(torch::kDouble), {}, 1, 1);
  torch::Tensor error_sum = torch::zeros_like(z);
  double squared_error = 0;
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < layers; ++l) {
    SKConv2d layer(SKConv2dOptions(in, out, 3).padding(1).terms(terms).rank(rank), dense);
    const torch::Tensor error = layer(x).to(torch::kDouble) - (z + layer->bias.to(torch::kDouble).view({1, -1, 1, 1}));
    error_sum += error;
    squared_error += error.pow(2).sum().item<double>();
  }
  const double expected = static_cast<double>(out - 1) * z.pow(2).sum().item<double>() / (2.0 * terms * rank);
  EXPECT_NEAR(squared_error / layers / expected, 1.0, 0.15);
  const double mean_error = (error_sum / layers).norm().item<double>();
  EXPECT_LE(mean_error, 3 * std::sqrt(expected / layers)) << "the average does not converge to conv2d(X, K) + b";
}

// CPU autocast to bf16 for the scope of the object.
class Bf16Autocast {
 public:
  Bf16Autocast() : previous_enabled_(at::autocast::is_cpu_enabled()), previous_dtype_(at::autocast::get_autocast_cpu_dtype()) {
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
    at::autocast::increment_nesting();
  }
  ~Bf16Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(previous_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;

 private:
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

// bf16 keeps 8 significant bits (unit roundoff 2^-8 = 0.0039); rounding the input, S1s, the
// 2Lk intermediate channels and the output stays within a few of those.
constexpr double kBf16Tolerance = 4 * 0.0039;

TEST(SKConv2d, Bf16UnderAutocastIsCloseToFp32) {
  torch::manual_seed(13);
  SKConv2d layer(SKConv2dOptions(8, 16, 3).padding(1).terms(2).rank(2));
  const torch::Tensor x = torch::randn({2, 8, 12, 12});
  const torch::Tensor exact = layer(x);
  torch::Tensor y;
  {
    Bf16Autocast autocast;
    y = layer(x);
  }
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LE(relative_error(y, exact), kBf16Tolerance);
  y.to(torch::kFloat).sum().backward();
  ASSERT_TRUE(layer->S1s.grad().defined());
  EXPECT_EQ(layer->S1s.grad().scalar_type(), torch::kFloat);
}

TEST(SKConv2d, Bf16LayerIsCloseToFp32) {
  torch::manual_seed(17);
  SKConv2d layer(SKConv2dOptions(8, 16, 3).padding(1).terms(2).rank(2));
  const torch::Tensor x = torch::randn({2, 8, 12, 12}).contiguous(torch::MemoryFormat::ChannelsLast);
  const torch::Tensor exact = layer(x);
  layer->to(torch::kBFloat16);
  const torch::Tensor y = layer(x.to(torch::kBFloat16));
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LE(relative_error(y, exact), kBf16Tolerance);
}

TEST(SKConv2d, WorksInSequential) {
  torch::manual_seed(19);
  SKConv2d layer(SKConv2dOptions(3, 8, 3).padding(1).rank(2));
  torch::nn::Sequential model(layer, torch::nn::ReLU());
  const torch::Tensor x = torch::randn({2, 3, 6, 6});
  EXPECT_TRUE(torch::equal(model->forward(x), torch::relu(layer(x))));
}

TEST(SKConv2d, SaveAndLoadRoundTrip) {
  const auto options = SKConv2dOptions(3, 8, 3).padding(1).terms(2).rank(2);
  torch::manual_seed(23);
  SKConv2d saved(options);
  testing::TempDir dir;
  torch::save(saved, (dir / "skconv2d.pt").string());
  torch::manual_seed(29);
  SKConv2d loaded(options);
  ASSERT_FALSE(torch::equal(loaded->U1s, saved->U1s));
  torch::load(loaded, (dir / "skconv2d.pt").string());
  for (const auto& item : saved->named_parameters()) {
    EXPECT_TRUE(torch::equal(loaded->named_parameters()[item.key()], item.value())) << item.key();
  }
  for (const auto& item : saved->named_buffers()) {
    EXPECT_TRUE(torch::equal(loaded->named_buffers()[item.key()], item.value())) << item.key();
  }
  const torch::Tensor x = torch::randn({1, 3, 5, 5});
  EXPECT_TRUE(torch::equal(loaded(x), saved(x)));
}

TEST(SKConv2d, CloneCopiesParametersAndBuffers) {
  SKConv2d layer(SKConv2dOptions(3, 8, 3).rank(2));
  const auto copy = std::dynamic_pointer_cast<SKConv2dImpl>(layer->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(torch::equal(copy->S1s, layer->S1s));
  EXPECT_TRUE(torch::equal(copy->U1s, layer->U1s));
  EXPECT_TRUE(torch::equal(copy->bias, layer->bias));
  EXPECT_NE(copy->S1s.data_ptr(), layer->S1s.data_ptr());
}

TEST(SKConv2d, BadOptionsNameTheField) {
  using testing::Contains;
  const std::vector<std::pair<SKConv2dOptions, std::string>> cases{
      {SKConv2dOptions(0, 8, 3), "SKConv2d in_channels: must be at least 1, got 0"},
      {SKConv2dOptions(3, 0, 3), "SKConv2d out_channels: must be at least 1, got 0"},
      {SKConv2dOptions(3, 8, {3, 0}), "SKConv2d kernel_size: must be at least 1, got 0"},
      {SKConv2dOptions(3, 8, 3).stride({0, 1}), "SKConv2d stride: must be at least 1, got 0"},
      {SKConv2dOptions(3, 8, 3).padding({1, -1}), "SKConv2d padding: must be at least 0, got -1"},
      {SKConv2dOptions(3, 8, 3).terms(0), "SKConv2d terms: must be at least 1, got 0"},
      {SKConv2dOptions(3, 8, 3).rank(-2), "SKConv2d rank: must be at least 1, got -2"},
  };
  for (const auto& option_case : cases) {  // (a lambda cannot capture a structured binding in C++17)
    const SKConv2dOptions& options = option_case.first;
    EXPECT_TRUE(Contains(testing::error_message<UsageError>([&] { SKConv2d{options}; }), option_case.second));
  }
}

TEST(SKConv2d, BadDenseWeightsAndInputsNameTheField) {
  using testing::Contains;
  using testing::error_message;
  const auto options = SKConv2dOptions(3, 4, 3).rank(1);
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { SKConv2d(options, torch::randn({3, 4, 3, 3})); }),
                       "SKConv2d dense_weight: expected [4, 3, 3, 3] (torch::nn::Conv2d's layout), got [3, 4, 3, 3]"));
  SKConv2d layer(options);
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { layer(torch::randn({2, 4, 8, 8})); }),
                       "SKConv2d input: expected [N, 3, H, W], got [2, 4, 8, 8]"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { layer(torch::randn({3, 8, 8})); }),
                       "SKConv2d input: expected [N, 3, H, W], got [3, 8, 8]"));
}

TEST(SKConv2d, SavingNothingIsDetectedAndReported) {
  EXPECT_FALSE(sketch_saves_nothing(SKConv2dOptions(32, 64, 3).terms(2).rank(15)));
  EXPECT_TRUE(sketch_saves_nothing(SKConv2dOptions(32, 64, 3).terms(2).rank(16)));
  ::testing::internal::CaptureStderr();
  SKConv2d saving(SKConv2dOptions(32, 64, 3).terms(2).rank(15));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ::testing::internal::CaptureStderr();
  SKConv2d not_saving(SKConv2dOptions(32, 64, 3).terms(2).rank(16));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "afterburner: SKConv2d(32, 64, kernel 3x3, terms 2, rank 16) has 18432 parameters, the dense layer "
            "18432: no saving\n");
}

}  // namespace
}  // namespace afterburner::sketch
