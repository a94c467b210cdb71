// pack_bf16_convolutions and afterburner::conv2d_packed: the rewritten graph computes LibTorch's
// bf16 convolution bit for bit (the same oneDNN primitive, its weight packed once) over the
// geometries of torchvision's networks, with the weight packed in the layout the images want and
// in one they do not (the dense weight then), twice, leaving its inputs alone; what it leaves to
// LibTorch.
#include "afterburner/infer/packed_conv.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/script.h>

#include <limits>
#include <string>
#include <vector>

#include "non_finite.h"
#include "test_models.h"
#include "testing.h"

namespace afterburner::infer {
namespace {
namespace jit = torch::jit;
using testing::BitwiseEqual;

struct Geometry {
  int64_t channels, size, out_channels, kernel, stride, padding, dilation, groups;
  bool bias;
};

// A frozen module running conv2d of `g` on bf16 channels-last weights, as optimize leaves them.
jit::Module frozen_convolution(const Geometry& g, torch::Dtype dtype = torch::kBFloat16) {
  jit::Module module("__torch__.Convolution");
  const auto weight = torch::randn({g.out_channels, g.channels / g.groups, g.kernel, g.kernel}).to(dtype);
  module.register_parameter("w", weight.contiguous(at::MemoryFormat::ChannelsLast), false);
  module.register_parameter("b", torch::randn({g.out_channels}).to(dtype), false);
  const std::string bias = g.bias ? "self.b" : "None";
  module.define("def forward(self, x):\n    return torch.conv2d(x, self.w, " + bias + ", [" + std::to_string(g.stride) +
                ", " + std::to_string(g.stride) + "], [" + std::to_string(g.padding) + ", " +
                std::to_string(g.padding) + "], [" + std::to_string(g.dilation) + ", " +
                std::to_string(g.dilation) + "], " + std::to_string(g.groups) + ")\n");
  module.eval();
  return jit::freeze(module);
}

torch::Tensor images(const Geometry& g, int64_t batch) {
  const torch::Tensor x = torch::randn({batch, g.channels, g.size, g.size}).to(torch::kBFloat16);
  return x.contiguous(at::MemoryFormat::ChannelsLast);
}

int pack(jit::Module& module) {
  auto graph = module.get_method("forward").graph();
  return pack_bf16_convolutions(graph);
}

// A copy of `module` with its convolutions packed before its first call (TorchScript's executor
// keeps the plan of a graph's first calls: a graph rewritten after them would not run); `module`
// keeps LibTorch's.
jit::Module packed_copy(const jit::Module& module) {
  jit::Module copy = module.clone();
  EXPECT_EQ(pack(copy), 1);
  EXPECT_TRUE(testing::graph_has(copy, "afterburner::conv2d_packed"));
  EXPECT_TRUE(testing::graph_has(module, "aten::conv2d")) << "the copy shares the module's graph";
  return copy;
}

// ResNet's stem and 3x3, EfficientNet's 1x1 (672 -> 28 channels: packed for a guessed image size,
// its 14-pixel images want another layout) and depthwise stride 2, a dilated one, one input
// channel, no bias.
const std::vector<Geometry> kGeometries{
    {3, 224, 64, 7, 2, 3, 1, 1, true},   {64, 56, 64, 3, 1, 1, 1, 1, false}, {672, 14, 28, 1, 1, 0, 1, 1, true},
    {32, 28, 32, 3, 2, 1, 1, 32, true},  {16, 20, 24, 3, 1, 2, 2, 1, true},  {1, 28, 16, 3, 1, 1, 1, 1, true},
};

TEST(PackedConv, ComputesLibTorchsBf16ConvolutionBitForBit) {
  for (const Geometry& g : kGeometries) {
    for (const int64_t batch : {1, 7}) {
      SCOPED_TRACE(::testing::Message() << g.channels << " -> " << g.out_channels << ", " << g.kernel << "x"
                                        << g.kernel << " over " << g.size << " px, groups " << g.groups << ", batch "
                                        << batch);
      torch::manual_seed(g.channels + batch);
      jit::Module module = frozen_convolution(g), packed = packed_copy(module);
      torch::Tensor x = images(g, batch);
      x[0][0][1][2] = std::numeric_limits<float>::quiet_NaN();  // NaN where LibTorch's convolution puts it
      const torch::Tensor before = x.clone();
      torch::NoGradGuard no_grad;
      const torch::Tensor expected = module.forward({x}).toTensor();
      const torch::Tensor first = packed.forward({x}).toTensor(), second = packed.forward({x}).toTensor();
      EXPECT_TRUE(BitwiseEqual(first, expected));
      EXPECT_TRUE(BitwiseEqual(second, first)) << "a second call answered otherwise";
      EXPECT_TRUE(first.is_contiguous(at::MemoryFormat::ChannelsLast));
      EXPECT_TRUE(BitwiseEqual(x, before)) << "the input changed";
    }
  }
}

// Images of another size than the first call's (a server's batches and shapes vary), NCHW
// images, and a module under autograd: the same answers as LibTorch's.
TEST(PackedConv, OtherImagesLayoutsAndAutogradGiveLibTorchsAnswer) {
  torch::manual_seed(1);
  const Geometry g{24, 15, 40, 3, 1, 1, 1, 1, true};
  jit::Module original = frozen_convolution(g), module = packed_copy(original);
  torch::NoGradGuard no_grad;
  for (const int64_t size : {15, 9, 40}) {
    const torch::Tensor x = torch::randn({3, g.channels, size, size}).to(torch::kBFloat16);  // NCHW
    const torch::Tensor channels_last = x.contiguous(at::MemoryFormat::ChannelsLast);
    EXPECT_TRUE(BitwiseEqual(module.forward({x}).toTensor(), original.forward({channels_last}).toTensor()));
  }
  torch::AutoGradMode grad(true);
  const torch::Tensor x = images(g, 2).requires_grad_();
  const torch::Tensor y = module.forward({x}).toTensor();
  ASSERT_TRUE(y.requires_grad());
  const torch::Tensor grad_x = torch::autograd::grad({y.to(torch::kFloat).sum()}, {x})[0];
  const torch::Tensor x_again = x.detach().clone().requires_grad_();
  const torch::Tensor y_again = original.forward({x_again}).toTensor();
  const torch::Tensor grad_again = torch::autograd::grad({y_again.to(torch::kFloat).sum()}, {x_again})[0];
  EXPECT_TRUE(BitwiseEqual(grad_x, grad_again));
}

TEST(PackedConv, LeavesOtherConvolutionsAlone) {
  torch::manual_seed(2);
  const Geometry g{8, 12, 8, 3, 1, 1, 1, 1, true};
  jit::Module fp32 = frozen_convolution(g, torch::kFloat);
  EXPECT_EQ(pack(fp32), 0);  // optimize_for_inference packs fp32 weights itself
  jit::Module same("__torch__.Same");  // padding given as 'same': LibTorch's overload, left to it
  same.register_parameter("w", torch::randn({8, 8, 3, 3}).to(torch::kBFloat16), false);
  same.define("def forward(self, x):\n    return torch.conv2d(x, self.w, None, 1, 'same')\n");
  same.eval();
  jit::Module frozen = jit::freeze(same);
  EXPECT_EQ(pack(frozen), 0);
}

}  // namespace
}  // namespace afterburner::infer
