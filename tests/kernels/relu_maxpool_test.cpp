#include "afterburner/kernels/relu_maxpool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/onednn_tensor.h"
#include "afterburner/core/threads.h"
#include "autograd_check.h"
#include "non_finite.h"
#include "testing.h"

namespace afterburner::kernels {
namespace {

using afterburner::testing::AllClose;
using afterburner::testing::Contains;
using afterburner::testing::error_message;
using afterburner::testing::Identical;
using afterburner::testing::sprinkle_non_finite;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr const char* kFusedNode = "ReluMaxPoolFunction";

// The unfused composition the fused op replaces, in the input's own dtype.
torch::Tensor torch_relu_max_pool2d(const torch::Tensor& x, const ReluMaxPool2dOptions& o) {
  return torch::max_pool2d(torch::relu(x), o.kernel_size(), o.stride(), o.padding(), o.dilation(), o.ceil_mode());
}

struct Result {
  torch::Tensor out, grad;
  std::string backward_node;  // which autograd node produced `out`: tells the fast path from the fallback
};

// Output and input gradient of `pool` at x for the output gradient grad_out.
template <typename Pool>
Result run(const Pool& pool, const torch::Tensor& x, const torch::Tensor& grad_out) {
  auto input = x.detach().requires_grad_(true);  // keeps x's strides
  auto out = pool(input);
  auto grad = torch::autograd::grad({out}, {input}, {grad_out})[0];
  return {out.detach(), grad, out.grad_fn()->name()};
}

Result fused(const torch::Tensor& x, const torch::Tensor& grad_out, const ReluMaxPool2dOptions& options) {
  return run([&](const torch::Tensor& input) { return relu_max_pool2d(input, options); }, x, grad_out);
}

// torch's composition computed in double from the same (exactly representable) values.
Result double_reference(const torch::Tensor& x, const torch::Tensor& grad_out, const ReluMaxPool2dOptions& options) {
  return run([&](const torch::Tensor& input) { return torch_relu_max_pool2d(input, options); },
             x.to(torch::kDouble), grad_out.to(torch::kDouble));
}

// torch's composition in the input's dtype: ties and NaNs must route gradients identically.
Result same_dtype_reference(const torch::Tensor& x, const torch::Tensor& grad_out, const ReluMaxPool2dOptions& options) {
  return run([&](const torch::Tensor& input) { return torch_relu_max_pool2d(input, options); }, x, grad_out);
}

double tolerance(torch::ScalarType dtype) { return dtype == torch::kBFloat16 ? 1e-2 : 1e-6; }

std::string format_name(at::MemoryFormat format) {
  return format == at::MemoryFormat::ChannelsLast ? "channels_last" : "nchw";
}

// Windows with ties, zeros, negatives, -inf and NaNs, one 2x2 window per channel.
torch::Tensor special_windows(torch::ScalarType dtype) {
  const std::vector<std::vector<double>> windows{
      {3, 3, 3, 3},             // constant positive: the first element wins
      {1, 5, 5, 2},             // tie on the maximum: the first of the two
      {0, 0, 0, 0},             // zeros: ReLU's output is 0, no gradient
      {-1, -2, -1, -3},         // negatives with a tied maximum: no gradient
      {0, -1, 0, -2},           // zero maximum among negatives: no gradient
      {-kInf, -kInf, -kInf, -kInf},
      {kNaN, 1, 2, 3},          // a NaN wins over numbers
      {1, kNaN, kNaN, 0},       // the last NaN wins over an earlier one
      {-1, -2, kNaN, -3},       // a NaN among negatives still passes its gradient
      {kNaN, kNaN, kNaN, kNaN},
  };
  std::vector<double> values;
  for (const auto& window : windows) values.insert(values.end(), window.begin(), window.end());
  const auto channels = static_cast<int64_t>(windows.size());
  return torch::tensor(values, torch::kDouble).view({1, channels, 2, 2}).to(dtype);
}

using RandomCase = std::tuple<torch::ScalarType, at::MemoryFormat, std::vector<int64_t>, int64_t>;

class ReluMaxPoolRandom : public ::testing::TestWithParam<RandomCase> {};

std::string random_case_name(const ::testing::TestParamInfo<RandomCase>& info) {
  const auto& [dtype, format, shape, kernel] = info.param;
  return std::string(c10::toString(dtype)) + "_" + format_name(format) + "_" + std::to_string(shape[0]) + "x" +
         std::to_string(shape[1]) + "x" + std::to_string(shape[2]) + "x" + std::to_string(shape[3]) + "_k" +
         std::to_string(kernel);
}

TEST_P(ReluMaxPoolRandom, MatchesTorchInDoublePrecision) {
  const auto& [dtype, format, shape, kernel] = GetParam();
  torch::manual_seed(kernel * 1000 + shape[3]);
  const ReluMaxPool2dOptions options(kernel);
  auto x = torch::randn(shape).to(dtype).contiguous(format);
  auto grad_out = torch::randn(torch::max_pool2d(x, kernel).sizes()).to(dtype).contiguous(format);

  auto actual = fused(x, grad_out, options);
  auto expected = double_reference(x, grad_out, options);
  EXPECT_TRUE(Contains(actual.backward_node, kFusedNode));
  EXPECT_EQ(actual.out.scalar_type(), dtype);
  EXPECT_EQ(actual.grad.scalar_type(), dtype);
  EXPECT_TRUE(actual.out.is_contiguous(format)) << "output is not " << format_name(format);
  EXPECT_TRUE(actual.grad.is_contiguous(format)) << "input gradient is not " << format_name(format);
  EXPECT_TRUE(AllClose(actual.out, expected.out, tolerance(dtype), tolerance(dtype))) << "forward";
  EXPECT_TRUE(AllClose(actual.grad, expected.grad, tolerance(dtype), tolerance(dtype))) << "backward";
}

// Shapes cover rows of >= 8 windows (wide blocks, the last one overlapping), 4..7 windows (narrow
// blocks), fewer than 4, channel counts on either side of those sizes for channels_last, odd
// sizes (floor mode drops the last row and column) and batch 1; kernel 5 runs the kernel built for
// any size.
INSTANTIATE_TEST_SUITE_P(
    Shapes, ReluMaxPoolRandom,
    ::testing::Combine(::testing::Values(torch::kFloat, torch::kBFloat16),
                       ::testing::Values(at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast),
                       ::testing::Values(std::vector<int64_t>{1, 3, 7, 9}, std::vector<int64_t>{2, 5, 12, 11},
                                         std::vector<int64_t>{2, 19, 30, 29}, std::vector<int64_t>{3, 32, 28, 28},
                                         std::vector<int64_t>{1, 8, 16, 48}),
                       ::testing::Values(2, 3, 5)),
    random_case_name);

using ExactCase = std::tuple<torch::ScalarType, at::MemoryFormat>;

class ReluMaxPoolExact : public ::testing::TestWithParam<ExactCase> {};

std::string exact_case_name(const ::testing::TestParamInfo<ExactCase>& info) {
  const auto& [dtype, format] = info.param;
  return std::string(c10::toString(dtype)) + "_" + format_name(format);
}

TEST_P(ReluMaxPoolExact, TiesZerosAndNaNsRouteGradientsLikeTorch) {
  const auto& [dtype, format] = GetParam();
  auto x = special_windows(dtype).contiguous(format);
  auto grad_out = torch::arange(1, x.size(1) + 1, torch::kDouble).view({1, -1, 1, 1}).to(dtype).contiguous(format);
  auto actual = fused(x, grad_out, 2);
  auto expected = same_dtype_reference(x, grad_out, 2);
  EXPECT_TRUE(Contains(actual.backward_node, kFusedNode));
  EXPECT_TRUE(Identical(actual.out, expected.out)) << "forward";
  EXPECT_TRUE(Identical(actual.grad, expected.grad)) << "backward";
}

TEST_P(ReluMaxPoolExact, TiedKernel3WindowsRouteGradientsLikeTorch) {
  const auto& [dtype, format] = GetParam();
  torch::manual_seed(3);
  // Small integers make ties frequent; many windows are all <= 0.
  auto x = torch::randint(-3, 3, {2, 9, 9, 12}).to(dtype).contiguous(format);
  auto grad_out = torch::randn({2, 9, 3, 4}).to(dtype).contiguous(format);
  auto actual = fused(x, grad_out, 3);
  auto expected = same_dtype_reference(x, grad_out, 3);
  EXPECT_TRUE(Contains(actual.backward_node, kFusedNode));
  EXPECT_TRUE(Identical(actual.out, expected.out)) << "forward";
  EXPECT_TRUE(Identical(actual.grad, expected.grad)) << "backward";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReluMaxPoolExact,
                         ::testing::Combine(::testing::Values(torch::kFloat, torch::kBFloat16, torch::kDouble),
                                            ::testing::Values(at::MemoryFormat::Contiguous,
                                                              at::MemoryFormat::ChannelsLast)),
                         exact_case_name);

// NCHW only: the finite-difference helper views its leaf flat. channels_last gradients are
// checked against torch's in double by ReluMaxPoolExact.
TEST(ReluMaxPool, GradientMatchesFiniteDifferencesInDouble) {
  torch::manual_seed(7);
  auto x = torch::randn({2, 3, 6, 7}, torch::kDouble).requires_grad_(true);
  auto weights = torch::randn({2, 3, 3, 3}, torch::kDouble);
  afterburner::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& inputs) { return (relu_max_pool2d(inputs[0]) * weights).sum(); }, {x});
}

TEST(ReluMaxPool, OutputGradientInAnotherMemoryFormatIsAccepted) {
  torch::manual_seed(11);
  auto x = torch::randn({2, 16, 10, 10}).contiguous(at::MemoryFormat::ChannelsLast);
  auto grad_out = torch::randn({2, 16, 5, 5});  // NCHW, as a following reshape would produce
  auto actual = fused(x, grad_out, 2);
  auto expected = double_reference(x, grad_out, 2);
  EXPECT_TRUE(AllClose(actual.grad, expected.grad, 1e-6));
}

TEST(ReluMaxPool, SameResultsOnOneAndTwoThreads) {
  torch::manual_seed(5);
  auto x = torch::randn({4, 32, 28, 28});
  auto grad_out = torch::randn({4, 32, 14, 14});
  Result one, two;
  {
    ThreadsGuard threads(1);
    one = fused(x, grad_out, 2);
  }
  {
    ThreadsGuard threads(2);
    two = fused(x, grad_out, 2);
  }
  EXPECT_TRUE(Identical(one.out, two.out));
  EXPECT_TRUE(Identical(one.grad, two.grad));
}

TEST(ReluMaxPool, WithoutGradientRecordingReturnsTheSameValues) {
  torch::manual_seed(2);
  auto x = torch::randn({2, 8, 12, 12}, torch::requires_grad());
  auto expected = torch_relu_max_pool2d(x, 2).detach();
  {
    torch::NoGradGuard no_grad;
    auto out = relu_max_pool2d(x);
    EXPECT_FALSE(out.requires_grad());
    EXPECT_TRUE(Identical(out, expected));
  }
  {
    c10::InferenceMode inference;
    auto out = relu_max_pool2d(x.detach());
    EXPECT_TRUE(out.is_inference());
    EXPECT_TRUE(Identical(out, expected));
  }
  EXPECT_TRUE(Identical(relu_max_pool2d(x.detach()), expected)) << "input without requires_grad";
}

TEST(ReluMaxPool, AutocastKeepsTheInputDtype) {
  torch::manual_seed(4);
  auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1));
  auto images = torch::randn({2, 1, 12, 12});
  torch::Tensor activations, pooled, fp32_pooled;
  {
    afterburner::testing::BFloat16Autocast autocast;
    activations = conv(images);
    pooled = relu_max_pool2d(activations);
    fp32_pooled = relu_max_pool2d(images);
  }
  ASSERT_EQ(activations.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(pooled.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(fp32_pooled.scalar_type(), torch::kFloat);
  EXPECT_TRUE(Identical(pooled, torch_relu_max_pool2d(activations, 2)));
  pooled.sum().backward();
  EXPECT_TRUE(conv->weight.grad().defined());
}

TEST(ReluMaxPool, DoubleBackwardIsRefused) {
  auto x = torch::randn({1, 2, 4, 4}, torch::requires_grad());
  auto loss = relu_max_pool2d(x).pow(2).sum();
  auto message = error_message<UsageError>(
      [&] { torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true); });
  EXPECT_TRUE(Contains(message, "create_graph: relu_max_pool2d's backward is not differentiable"));
  EXPECT_TRUE(torch::autograd::grad({loss}, {x})[0].defined()) << "a first-order backward still works";
}

TEST(ReluMaxPool, EmptyBatchGivesAnEmptyOutput) {
  auto x = torch::randn({0, 4, 8, 8}, torch::requires_grad());
  auto out = relu_max_pool2d(x);
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{0, 4, 4, 4}));
  EXPECT_EQ(torch::autograd::grad({out.sum()}, {x})[0].sizes(), x.sizes());
}

struct FallbackCase {
  std::string name;
  torch::Tensor x;
  ReluMaxPool2dOptions options;
};

// Inputs and options outside the fast path run torch's composition: same values and gradients.
TEST(ReluMaxPool, FallbackPathsMatchTorch) {
  torch::manual_seed(9);
  auto image = torch::randn({2, 4, 11, 13});
  const std::vector<FallbackCase> cases{
      {"non-contiguous", image.transpose(2, 3), 2},
      {"strided slice", image.slice(3, 0, 13, 2), 2},
      {"3-D", torch::randn({4, 10, 10}), 2},
      {"padding", image, ReluMaxPool2dOptions(3).padding(1)},
      {"dilation", image, ReluMaxPool2dOptions(2).dilation(2)},
      {"ceil_mode with a partial window", image, ReluMaxPool2dOptions(2).ceil_mode(true)},
      {"kernel != stride", image, ReluMaxPool2dOptions(3).stride(2)},
      {"kernel 16 (too many window positions for a byte)", torch::randn({1, 2, 33, 32}), 16},
  };
  for (const auto& c : cases) {
    auto expected_out = torch_relu_max_pool2d(c.x, c.options);
    auto grad_out = torch::randn_like(expected_out);
    auto actual = fused(c.x, grad_out, c.options);
    auto expected = same_dtype_reference(c.x, grad_out, c.options);
    EXPECT_FALSE(Contains(actual.backward_node, kFusedNode)) << c.name;
    EXPECT_TRUE(Identical(actual.out, expected.out)) << c.name;
    EXPECT_TRUE(Identical(actual.grad, expected.grad)) << c.name;
  }
}

TEST(ReluMaxPool, CeilModeWithoutPartialWindowsMatchesTorch) {
  torch::manual_seed(6);
  auto x = torch::randn({2, 4, 12, 12});
  const auto options = ReluMaxPool2dOptions(2).ceil_mode(true);
  auto grad_out = torch::randn({2, 4, 6, 6});
  auto actual = fused(x, grad_out, options);
  auto expected = same_dtype_reference(x, grad_out, options);
  EXPECT_TRUE(Contains(actual.backward_node, kFusedNode));
  EXPECT_TRUE(Identical(actual.out, expected.out));
  EXPECT_TRUE(Identical(actual.grad, expected.grad));
}

TEST(ReluMaxPool, BadOptionsNameTheirField) {
  auto x = torch::randn({1, 2, 4, 4});
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { relu_max_pool2d(x, 0, 2); }), "kernel_size: must be at least 1"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { relu_max_pool2d(x, 2, 0); }), "stride: must be at least 1, got 0"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { relu_max_pool2d(x, ReluMaxPool2dOptions(2).padding(-1)); }),
                       "padding: must be at least 0, got -1"));
  EXPECT_TRUE(Contains(error_message<UsageError>([&] { relu_max_pool2d(x, ReluMaxPool2dOptions(2).dilation(0)); }),
                       "dilation: must be at least 1, got 0"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { ReluMaxPool2d{ReluMaxPool2dOptions(-2)}; }), "kernel_size"));
}

// Overlapping and padded windows, as ResNet's stem pools (3x3, stride 2, padding 1): without a
// gradient to record, a kernel of ours; with one, torch's composition. Both give torch's values.
struct OverlappingCase {
  int64_t kernel, stride, padding;
  bool ceil_mode;
};

const std::vector<OverlappingCase> kOverlapping{{3, 2, 1, false}, {3, 2, 1, true}, {3, 1, 1, false},
                                                {2, 1, 0, false}, {5, 3, 2, true}, {3, 2, 0, true},
                                                {4, 3, 1, false}, {2, 2, 1, false}};

ReluMaxPool2dOptions options_of(const OverlappingCase& c) {
  return ReluMaxPool2dOptions(c.kernel).stride(c.stride).padding(c.padding).ceil_mode(c.ceil_mode);
}

// Random values with NaN, +inf and -inf sprinkled over them, and small integers for ties.
torch::Tensor values_with_non_finite(const std::vector<int64_t>& shape, torch::ScalarType dtype) {
  auto x = sprinkle_non_finite(torch::randn(shape, torch::kDouble));
  auto ties = x.view(-1).slice(0, 5, x.numel(), 4);
  ties.copy_(torch::randint(-2, 3, ties.sizes()));
  return x.to(dtype);
}

class ReluMaxPoolOverlapping : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ReluMaxPoolOverlapping, WithoutGradientMatchesTorchTwice) {
  const auto& [dtype, format] = GetParam();
  torch::manual_seed(12);
  // Widths below, at and above a vector of 8 windows; batch 1, odd sizes, depths of 1 to 19.
  const std::vector<std::vector<int64_t>> shapes{{1, 1, 5, 5}, {2, 3, 12, 11}, {1, 19, 17, 30}, {2, 8, 9, 4},
                                                 {3, 16, 34, 33}};
  for (const auto& shape : shapes) {
    const auto x = values_with_non_finite(shape, dtype).contiguous(format);
    const auto before = x.clone();
    for (const auto& c : kOverlapping) {
      SCOPED_TRACE(::testing::Message() << "shape " << x.sizes() << " kernel " << c.kernel << " stride " << c.stride
                                        << " padding " << c.padding << " ceil_mode " << c.ceil_mode);
      const torch::NoGradGuard no_grad;
      const auto expected = torch_relu_max_pool2d(x, options_of(c));
      const auto first = relu_max_pool2d(x, options_of(c));
      EXPECT_TRUE(Identical(first, expected));
      EXPECT_TRUE(first.is_contiguous(format)) << "output is not " << format_name(format);
      EXPECT_TRUE(Identical(relu_max_pool2d(x, options_of(c)), first)) << "second call";
    }
    EXPECT_TRUE(torch::equal(x.nan_to_num(), before.nan_to_num())) << "input changed";
  }
}

TEST_P(ReluMaxPoolOverlapping, WithGradientRunsTorchsComposition) {
  const auto& [dtype, format] = GetParam();
  torch::manual_seed(13);
  const auto x = torch::randn({2, 5, 11, 12}).to(dtype).contiguous(format);
  const auto options = options_of(kOverlapping.front());
  const auto grad_out = torch::randn_like(torch_relu_max_pool2d(x, options));
  const auto actual = fused(x, grad_out, options);
  const auto expected = same_dtype_reference(x, grad_out, options);
  EXPECT_FALSE(Contains(actual.backward_node, kFusedNode));
  EXPECT_TRUE(Identical(actual.out, expected.out));
  EXPECT_TRUE(Identical(actual.grad, expected.grad));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReluMaxPoolOverlapping,
                         ::testing::Combine(::testing::Values(torch::kFloat, torch::kBFloat16, torch::kDouble),
                                            ::testing::Values(at::MemoryFormat::Contiguous,
                                                              at::MemoryFormat::ChannelsLast)),
                         exact_case_name);

TEST(ReluMaxPool, OverlappingWindowsSameResultsOnOneAndTwoThreads) {
  torch::manual_seed(14);
  const auto x = values_with_non_finite({4, 8, 29, 31}, torch::kFloat);
  const auto options = options_of(kOverlapping.front());
  const torch::NoGradGuard no_grad;
  torch::Tensor one, two;
  {
    ThreadsGuard threads(1);
    one = relu_max_pool2d(x, options);
  }
  {
    ThreadsGuard threads(2);
    two = relu_max_pool2d(x, options);
  }
  EXPECT_TRUE(Identical(one, two));
}

// oneDNN tensors, as an optimized inference graph holds them: a convolution's output in oneDNN's
// channel-blocked layout (6 and 20 channels pad their last block with zeros, 32 do not) and a
// plain tensor from to_mkldnn. The result stays a oneDNN tensor, in its input's layout.
TEST(ReluMaxPool, OnOnednnTensorsMatchesTorchOnDenseOnes) {
  torch::manual_seed(15);
  for (const int64_t channels : {6, 20, 32}) {
    const auto images = values_with_non_finite({3, 4, 13, 14}, torch::kFloat);
    const auto weight = torch::randn({channels, 4, 3, 3});
    const torch::NoGradGuard no_grad;
    const auto blocked = torch::mkldnn_convolution(images.to_mkldnn(), weight.to_mkldnn(), {}, {1, 1}, {1, 1},
                                                   {1, 1}, 1);
    const auto plain = values_with_non_finite({2, channels, 9, 10}, torch::kFloat);
    const std::pair<const char*, torch::Tensor> inputs[] = {{"blocked", blocked}, {"plain", plain.to_mkldnn()}};
    for (const auto& [name, x] : inputs) {
      for (const auto& c : kOverlapping) {
        SCOPED_TRACE(::testing::Message() << name << ", " << channels << " channels, kernel " << c.kernel
                                          << " stride " << c.stride << " padding " << c.padding);
        const auto before = x.to_dense();
        const auto out = relu_max_pool2d(x, options_of(c));
        ASSERT_TRUE(out.is_mkldnn());
        EXPECT_EQ(onednn_images(out)->depth, onednn_images(x)->depth) << "not pooled in its own layout";
        EXPECT_TRUE(Identical(out.to_dense(), torch_relu_max_pool2d(before, options_of(c))));
        EXPECT_TRUE(Identical(x.to_dense(), before)) << "input changed";
        // The next oneDNN op reads padding channels: they must stay zero.
        const auto next = torch::mkldnn_convolution(out, torch::ones({1, channels, 1, 1}).to_mkldnn(), {}, {0, 0},
                                                    {1, 1}, {1, 1}, 1);
        EXPECT_TRUE(Identical(next.to_dense(), torch::conv2d(out.to_dense(), torch::ones({1, channels, 1, 1}))));
      }
      EXPECT_TRUE(Identical(relu_max_pool2d(x, 2).to_dense(), torch_relu_max_pool2d(x.to_dense(), 2)))
          << name << ": tiling windows";
    }
  }
}

// A model's cnn block, unfused and fused, with shared parameters.
torch::nn::Sequential cnn_block(bool fused_pool, const torch::nn::Conv2d& conv, const torch::nn::Linear& fc) {
  torch::nn::Sequential block(conv);
  if (fused_pool) {
    block->push_back(ReluMaxPool2d(2));
  } else {
    block->push_back(torch::nn::ReLU());
    block->push_back(torch::nn::MaxPool2d(2));
  }
  block->push_back(torch::nn::Flatten());
  block->push_back(fc);
  return block;
}

TEST(ReluMaxPool2dModule, WorksInsideSequentialWithTheSameGradients) {
  torch::manual_seed(1);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 8, 3).padding(1));
  torch::nn::Linear fc(8 * 7 * 7, 10);
  auto images = torch::randn({4, 1, 14, 14});
  std::vector<std::vector<torch::Tensor>> grads;
  for (bool fused_pool : {false, true}) {
    auto model = cnn_block(fused_pool, conv, fc);
    model->zero_grad();
    model->forward(images).pow(2).sum().backward();
    std::vector<torch::Tensor> model_grads;
    for (const auto& p : model->parameters()) model_grads.push_back(p.grad().clone());
    grads.push_back(model_grads);
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(AllClose(grads[1][i], grads[0][i], 1e-5, 1e-5)) << "parameter " << i;
  }
}

TEST(ReluMaxPool2dModule, PrintsAndClonesItsOptions) {
  torch::nn::Sequential model(ReluMaxPool2d(ReluMaxPool2dOptions(3).stride(3)));
  EXPECT_TRUE(Contains(c10::str(*model), "afterburner::kernels::ReluMaxPool2d(kernel_size=3, stride=3, padding=0"));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
  ASSERT_TRUE(copy);
  auto x = torch::randn({1, 2, 9, 9});
  EXPECT_TRUE(Identical(copy->forward(x), torch_relu_max_pool2d(x, 3)));
}

}  // namespace
}  // namespace afterburner::kernels
