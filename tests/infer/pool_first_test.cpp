// pool_before_pointwise_convolutions and afterburner::avg_pool_pointwise_conv2d, as
// prepare_for_inference runs them on DenseNet's transitions (BatchNorm, ReLU, 1x1 convolution, 2x2
// average pooling) and their variants (bias or none, an odd size the pooling floors or ceils, a
// 3x3 window of stride 2 without counting padding): the prepared model is within 16 fp32 epsilons
// of the answer's scale of the double-precision answer, at batch 1, 2, 7 and 8, twice the same,
// its input left alone. Inputs holding NaN or an infinity, or values large enough that a sum could
// overflow, get the graph's own order and bits (LibTorch's optimize_for_inference). Convolutions
// that read more than one pixel, poolings with padding or a divisor, and convolutions whose output
// something else reads are left alone.
#include "afterburner/infer/pool_first.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/script.h>

#include <limits>
#include <string>
#include <vector>

#include "afterburner/infer/optimize.h"
#include "non_finite.h"
#include "test_models.h"

namespace afterburner::infer::pool_first_test {
namespace {
namespace jit = torch::jit;
using testing::answer;
using testing::BitwiseEqual;
using testing::nodes_of_kind;

constexpr int64_t kChannels = 48, kOutChannels = 24;

// BatchNorm (as a scale and a shift), ReLU, a convolution of `kernel`, then `pool` of its output
// `y` (and `tail`): fp32, eval, not frozen.
jit::Module transition(int64_t kernel, bool bias, const std::string& pool, const std::string& tail = "") {
  jit::Module module("__torch__.Transition");
  module.register_parameter("scale", torch::rand({1, kChannels, 1, 1}) + 0.5, false);
  module.register_parameter("shift", torch::randn({1, kChannels, 1, 1}) * 0.1, false);
  module.register_parameter("w", torch::randn({kOutChannels, kChannels, kernel, kernel}) * 0.2, false);
  module.register_parameter("b", torch::randn({kOutChannels}) * 0.1, false);
  module.define(fmt::format("def forward(self, x):\n"
                            "    y = torch.relu(x * self.scale + self.shift)\n"
                            "    y = torch.conv2d(y, self.w, {}, [1, 1], [{}, {}], [1, 1], 1)\n"
                            "    return {}{}\n",
                            bias ? "self.b" : "None", kernel / 2, kernel / 2, pool, tail));
  module.eval();
  return module;
}

struct Pooling {
  const char* pool;
  int64_t size;
};

const std::vector<Pooling> kPoolings{{"torch.avg_pool2d(y, [2, 2], [2, 2])", 16},
                                     {"torch.avg_pool2d(y, [2, 2], [2, 2])", 7},
                                     {"torch.avg_pool2d(y, [2, 2], [2, 2], [0, 0], True)", 7},
                                     {"torch.avg_pool2d(y, [3, 3], [2, 2], [0, 0], True, False)", 9}};

TEST(PoolFirst, WithinTheSumsRoundingTwiceTheSame) {
  for (const Pooling& pooling : kPoolings) {
    for (const bool bias : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, size {}, bias {}", pooling.pool, pooling.size, bias));
      torch::manual_seed(pooling.size);
      jit::Module module = transition(1, bias, pooling.pool);
      jit::Module prepared = prepare_for_inference(jit::freeze(module));
      ASSERT_EQ(nodes_of_kind(prepared, "afterburner::avg_pool_pointwise_conv2d"), 1);
      EXPECT_EQ(nodes_of_kind(prepared, "prim::mkldnn_convolution"), 0);
      for (const int64_t batch : {1, 2, 7, 8}) {
        SCOPED_TRACE(fmt::format("batch {}", batch));
        const torch::Tensor x = torch::randn({batch, kChannels, pooling.size, pooling.size});
        const torch::Tensor before = x.clone();
        const torch::Tensor first = answer(prepared, x), second = answer(prepared, x);
        EXPECT_TRUE(BitwiseEqual(second, first)) << "a second call answered otherwise";
        EXPECT_TRUE(BitwiseEqual(x, before)) << "the input changed";
        const torch::Tensor reference = testing::exact_answer(module, x);
        ASSERT_EQ(first.sizes(), reference.sizes());
        const double scale = reference.abs().max().item<double>();
        EXPECT_LE((first.to(torch::kDouble) - reference).abs().max().item<double>() / scale,
                  16 * std::numeric_limits<float>::epsilon());
      }
    }
  }
}

TEST(PoolFirst, NonFiniteOrHugeInputsGetTheGraphsOwnAnswer) {
  torch::manual_seed(7);
  jit::Module module = transition(1, true, kPoolings[0].pool);
  jit::Module frozen = jit::freeze(module);
  jit::Module theirs = jit::optimize_for_inference(frozen);
  jit::Module prepared = prepare_for_inference(jit::freeze(module));
  ASSERT_EQ(nodes_of_kind(prepared, "afterburner::avg_pool_pointwise_conv2d"), 1);
  const torch::Tensor images = testing::images_with_non_finite({kChannels, 16, 16}, 300);
  SCOPED_TRACE("images with NaN, +inf, -inf and none");
  EXPECT_TRUE(BitwiseEqual(answer(prepared, images), answer(theirs, images)));
  EXPECT_TRUE(testing::AgreesWithNonFinite(answer(prepared, images), answer(module, images), 1e-5, 1e-5));
  torch::Tensor huge = torch::randn({2, kChannels, 16, 16});
  huge.view(-1)[100] = 1e30;  // times the weights' row sums: above 2^100
  EXPECT_TRUE(BitwiseEqual(answer(prepared, huge), answer(theirs, huge))) << "values near overflow";
  const torch::Tensor finite = images.slice(0, 3);
  EXPECT_FALSE(BitwiseEqual(answer(prepared, finite), answer(theirs, finite)))
      << "the finite image alone should be pooled first (rounded otherwise)";
}

TEST(PoolFirst, LeavesOtherConvolutionsAndPoolingsAlone) {
  torch::manual_seed(8);
  std::vector<jit::Module> others{
      transition(3, true, "torch.avg_pool2d(y, [2, 2], [2, 2])"),                            // reads 3x3 pixels
      transition(1, true, "torch.avg_pool2d(y, [2, 2], [2, 2], [1, 1])"),                    // padding
      transition(1, true, "torch.avg_pool2d(y, [2, 2], [2, 2], [0, 0], False, True, 3)"),    // a divisor
      transition(1, true, "torch.avg_pool2d(y, [2, 2], [2, 2])", " + y.sum()"),              // y read twice
  };
  for (jit::Module& module : others) {
    jit::Module prepared = prepare_for_inference(jit::freeze(module));
    EXPECT_EQ(nodes_of_kind(prepared, "afterburner::avg_pool_pointwise_conv2d"), 0);
    const torch::Tensor x = torch::randn({2, kChannels, 8, 8});
    EXPECT_TRUE(testing::AgreesWithNonFinite(answer(prepared, x), answer(module, x), 1e-4, 1e-4));
  }
}

}  // namespace
}  // namespace afterburner::infer::pool_first_test
