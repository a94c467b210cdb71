// The MkldnnCPU kernels of kernels/onednn_elementwise.cpp, reached as users reach them: ATen's
// ops called on oneDNN tensors. Each must equal the same ATen op on the dense tensor, NaN and
// infinities included, keep the oneDNN layout and its zero padding channels, and leave the input
// alone (out of place) or be the input (in place).
#include <gtest/gtest.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <tuple>
#include <string>
#include <vector>

#include "afterburner/core/onednn_tensor.h"
#include "non_finite.h"

namespace afterburner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Activation {
  std::string name;
  std::function<torch::Tensor(const torch::Tensor&)> apply;
  std::function<torch::Tensor(torch::Tensor&)> apply_;
};

std::vector<Activation> activations() {
  namespace F = torch::nn::functional;
  return {
      {"hardswish", [](const torch::Tensor& x) { return torch::hardswish(x); },
       [](torch::Tensor& x) { return torch::hardswish_(x); }},
      // hardsigmoid(0) = 0.5: the padding channels must be set back to 0.
      {"hardsigmoid", [](const torch::Tensor& x) { return torch::hardsigmoid(x); },
       [](torch::Tensor& x) { return torch::hardsigmoid_(x); }},
      {"silu", [](const torch::Tensor& x) { return torch::silu(x); }, [](torch::Tensor& x) { return torch::silu_(x); }},
      {"hardtanh as relu", [](const torch::Tensor& x) { return torch::hardtanh(x, 0.0, kInf); },
       [](torch::Tensor& x) { return torch::hardtanh_(x, 0.0, kInf); }},
      {"relu6", [](const torch::Tensor& x) { return torch::hardtanh(x, 0.0, 6.0); },
       [](torch::Tensor& x) { return torch::hardtanh_(x, 0.0, 6.0); }},
      {"clamp above 0", [](const torch::Tensor& x) { return torch::clamp(x, 0.5); },
       [](torch::Tensor& x) { return torch::clamp_(x, 0.5); }},
      {"clamp", [](const torch::Tensor& x) { return torch::clamp(x, -1.0, 1.0); },
       [](torch::Tensor& x) { return torch::clamp_(x, -1.0, 1.0); }},
  };
}

using afterburner::testing::AgreesWithNonFinite;
using afterburner::testing::Identical;
using afterburner::testing::sprinkle_non_finite;

// A 1x1 convolution summing all channels: oneDNN reads the padding channels too.
torch::Tensor channel_sum(const torch::Tensor& onednn) {
  const auto ones = torch::ones({1, onednn.size(1), 1, 1});
  return torch::mkldnn_convolution(onednn, ones.to_mkldnn(), {}, {0, 0}, {1, 1}, {1, 1}, 1).to_dense();
}

// oneDNN tensors as optimized graphs hold them: convolution outputs, channel-blocked (6 and 20
// channels pad their last block, 32 do not), and plain ones from to_mkldnn (fp32 and bf16).
std::vector<std::pair<std::string, torch::Tensor>> onednn_inputs() {
  torch::manual_seed(0);
  const torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> inputs;
  for (const int64_t channels : {6, 20, 32}) {
    const auto images = sprinkle_non_finite(torch::randn({2, 3, 7, 9}));
    inputs.emplace_back(std::to_string(channels) + " channels, blocked",
                        torch::mkldnn_convolution(images.to_mkldnn(), torch::randn({channels, 3, 3, 3}).to_mkldnn(),
                                                  {}, {1, 1}, {1, 1}, {1, 1}, 1));
  }
  inputs.emplace_back("plain", sprinkle_non_finite(torch::randn({3, 5, 4, 6}) * 4).to_mkldnn());
  inputs.emplace_back("plain bf16", sprinkle_non_finite(torch::randn({2, 5, 4, 6}) * 4).to_mkldnn(torch::kBFloat16));
  return inputs;
}

TEST(OnednnElementwise, OutOfPlaceEqualsATenOnDenseTensors) {
  const torch::NoGradGuard no_grad;
  for (const auto& [input_name, x] : onednn_inputs()) {
    const auto before = x.to_dense();
    for (const auto& activation : activations()) {
      SCOPED_TRACE(activation.name + " on " + input_name);
      const auto expected = activation.apply(before);
      const auto first = activation.apply(x);
      ASSERT_TRUE(first.is_mkldnn());
      EXPECT_EQ(onednn_images(first)->depth, onednn_images(x)->depth) << "not in its input's layout";
      EXPECT_TRUE(Identical(first.to_dense(), expected));
      EXPECT_TRUE(Identical(activation.apply(x).to_dense(), first.to_dense())) << "second call";
      EXPECT_TRUE(Identical(x.to_dense(), before)) << "input changed";
      if (x.scalar_type() == torch::kFloat) {
        EXPECT_TRUE(Identical(channel_sum(first), channel_sum(expected.to_mkldnn()))) << "padding channels";
      }
    }
  }
}

TEST(OnednnElementwise, InPlaceWritesItsInput) {
  const torch::NoGradGuard no_grad;
  for (const auto& activation : activations()) {
    for (const auto& [input_name, x] : onednn_inputs()) {
      SCOPED_TRACE(activation.name + " on " + input_name);
      const auto expected = activation.apply(x.to_dense());
      torch::Tensor target = x;
      const auto result = activation.apply_(target);
      EXPECT_TRUE(result.is_same(target));
      EXPECT_TRUE(Identical(target.to_dense(), expected));
      if (x.scalar_type() == torch::kFloat) {
        EXPECT_TRUE(Identical(channel_sum(target), channel_sum(expected.to_mkldnn()))) << "padding channels";
      }
    }
  }
}

// Other ranks than images go through a dense tensor: same values, still a oneDNN tensor.
TEST(OnednnElementwise, OtherRanksGoThroughDenseTensors) {
  const torch::NoGradGuard no_grad;
  const auto x = sprinkle_non_finite(torch::randn({4, 6}) * 4);
  for (const auto& activation : activations()) {
    SCOPED_TRACE(activation.name);
    const auto out = activation.apply(x.to_mkldnn());
    ASSERT_TRUE(out.is_mkldnn());
    EXPECT_TRUE(Identical(out.to_dense(), activation.apply(x)));
    auto target = x.to_mkldnn();
    activation.apply_(target);
    EXPECT_TRUE(Identical(target.to_dense(), activation.apply(x)));
  }
}

torch::Tensor broadcast_mul(const torch::Tensor& a, const torch::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("afterburner::broadcast_mul", "");
  return op.typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>().call(a, b);
}

// A convolution's output on oneDNN: channel-blocked, as an optimized graph's activations are.
torch::Tensor convolved(const torch::Tensor& images, int64_t channels) {
  const auto weight = torch::randn({channels, images.size(1), 1, 1});
  return torch::mkldnn_convolution(images.to_mkldnn(), weight.to_mkldnn(), {}, {0, 0}, {1, 1}, {1, 1}, 1);
}

// A squeeze-and-excitation's product: x [N, C, H, W] times scale [N, C, 1, 1], both oneDNN
// tensors (the scale a convolution's output too, or plain), either order, NaN and infinities in
// both; the product stays in x's layout with zero padding channels.
TEST(OnednnBroadcastMul, ScalesChannelsAsATenDoes) {
  torch::manual_seed(1);
  const torch::NoGradGuard no_grad;
  for (const int64_t channels : {6, 20, 32}) {
    for (const int64_t batch : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << channels << " channels, batch " << batch);
      const auto x = convolved(sprinkle_non_finite(torch::randn({batch, 3, 5, 7})), channels);
      const auto blocked_scale = convolved(sprinkle_non_finite(torch::randn({batch, 3, 1, 1}) * 3), channels);
      const auto plain_scale = sprinkle_non_finite(torch::randn({batch, channels, 1, 1})).to_mkldnn();
      for (const auto& scale : {blocked_scale, plain_scale}) {
        const auto x_before = x.to_dense(), scale_before = scale.to_dense();
        const auto expected = x_before * scale_before;
        const auto product = broadcast_mul(x, scale);
        ASSERT_TRUE(product.is_mkldnn());
        EXPECT_EQ(onednn_images(product)->depth, onednn_images(x)->depth) << "not in x's layout";
        EXPECT_TRUE(Identical(product.to_dense(), expected));
        EXPECT_TRUE(Identical(broadcast_mul(scale, x).to_dense(), expected)) << "scale first";
        EXPECT_TRUE(Identical(broadcast_mul(x, scale).to_dense(), expected)) << "second call";
        EXPECT_TRUE(Identical(channel_sum(product), channel_sum(expected.to_mkldnn()))) << "padding channels";
        EXPECT_TRUE(Identical(x.to_dense(), x_before) && Identical(scale.to_dense(), scale_before)) << "input changed";
      }
    }
  }
}

// Equal shapes are oneDNN's own product; other broadcasts go through dense tensors; dense
// tensors are ATen's mul.
TEST(OnednnBroadcastMul, OtherShapesAndDenseTensorsAreATensMul) {
  torch::manual_seed(2);
  const torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 6, 4, 5});
  for (const auto& other : {torch::randn({2, 6, 4, 5}), torch::randn({2, 1, 4, 5}), torch::randn({1, 6, 1, 1})}) {
    SCOPED_TRACE(::testing::Message() << "times " << other.sizes());
    const auto expected = x * other;
    EXPECT_TRUE(Identical(broadcast_mul(x.to_mkldnn(), other.to_mkldnn()).to_dense(), expected));
    EXPECT_TRUE(Identical(broadcast_mul(x, other), expected));
  }
}

// (y, the bound of |y| the op returns).
std::tuple<torch::Tensor, double> scale_shift_relu_to_onednn_bounded(const torch::Tensor& x, const torch::Tensor& scale,
                                                                     const torch::Tensor& shift) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("afterburner::scale_shift_relu_to_onednn", "");
  return op.typed<std::tuple<torch::Tensor, double>(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>()
      .call(x, scale, shift);
}

torch::Tensor scale_shift_relu_to_onednn(const torch::Tensor& x, const torch::Tensor& scale, const torch::Tensor& shift) {
  return std::get<0>(scale_shift_relu_to_onednn_bounded(x, scale, shift));
}

// An inference BatchNorm's ReLU into a oneDNN tensor: ATen's batch_norm (scale and shift formed
// here from its statistics) and relu, then to_mkldnn, to a rounding (ATen's batch_norm rounds
// some elements otherwise), NaN and infinities where they put them, at batch 1 and odd sizes;
// a second call bit for bit; the input left alone. A channel slice of a wider tensor (images
// apart) takes the one pass too; a channels-last input goes the three ops' way. On AVX-512 the
// result is in oneDNN's nChw16c (full blocks of 16 channels take the vector kernel, 7x9 images
// its 16-pixel tiles and a tail), as its convolutions read it; the op's second answer, the largest
// value written, is +infinity where one is NaN or infinite.
TEST(OnednnScaleShiftRelu, EqualsATensBatchNormReluAndConversion) {
  torch::manual_seed(3);
  const torch::NoGradGuard no_grad;
  for (const int64_t channels : {6, 16, 35, 64}) {
    for (const int64_t batch : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << channels << " channels, batch " << batch);
      const auto x = sprinkle_non_finite(torch::randn({batch, channels, 7, 9}) * 3);
      const auto mean = torch::randn({channels}), var = torch::rand({channels}) + 0.1;
      const auto weight = torch::randn({channels}), bias = torch::randn({channels});
      const double eps = 1e-5;
      const auto scale = weight / torch::sqrt(var + static_cast<float>(eps));
      const auto shift = bias - mean * scale;
      const auto before = x.clone();
      const auto expected = torch::relu(torch::batch_norm(x, weight, bias, mean, var, false, 0.1, eps, false));
      const auto out = scale_shift_relu_to_onednn(x, scale, shift);
      ASSERT_TRUE(out.is_mkldnn());
      EXPECT_EQ(onednn_images(out)->depth, __builtin_cpu_supports("avx512f") ? 16 : 1);
      EXPECT_TRUE(AgreesWithNonFinite(out.to_dense(), expected, 1e-6, 1e-6));
      EXPECT_TRUE(Identical(scale_shift_relu_to_onednn(x, scale, shift).to_dense(), out.to_dense())) << "second call";
      EXPECT_TRUE(AgreesWithNonFinite(channel_sum(out), channel_sum(expected.to_mkldnn()), 1e-4, 1e-5))
          << "as a convolution reads it (padding channels 0)";
      EXPECT_TRUE(Identical(x, before)) << "input changed";
      EXPECT_EQ(std::get<1>(scale_shift_relu_to_onednn_bounded(x, scale, shift)),
                std::numeric_limits<double>::infinity())
          << "values holding NaN and infinities have no bound";
      const auto finite = torch::randn({batch, channels, 7, 9}) * 3;
      const auto [finite_out, bound] = scale_shift_relu_to_onednn_bounded(finite, scale, shift);
      EXPECT_EQ(bound, finite_out.to_dense().max().item<double>()) << "the bound is the largest value written";
      // A channel slice of a wider tensor (a growing concatenation's, kernels/channel_concat.h).
      const auto wider = torch::cat({x, torch::randn({batch, 5, 7, 9})}, 1);
      EXPECT_TRUE(
          AgreesWithNonFinite(scale_shift_relu_to_onednn(wider.narrow(1, 0, channels), scale, shift).to_dense(),
                              expected, 1e-6, 1e-6));
      const auto channels_last = x.contiguous(at::MemoryFormat::ChannelsLast);
      EXPECT_TRUE(
          AgreesWithNonFinite(scale_shift_relu_to_onednn(channels_last, scale, shift).to_dense(), expected, 1e-6, 1e-6));
    }
  }
}

}  // namespace
}  // namespace afterburner
