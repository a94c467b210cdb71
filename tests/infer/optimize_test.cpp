// optimize(): each pass keeps the model's outputs and removes what it claims to.
#include "afterburner/infer/optimize.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "afterburner/core/error.h"
#include "afterburner/infer/model_file.h"
#include "non_finite.h"
#include "test_models.h"
#include "testing.h"

namespace afterburner::testing {
namespace {
using infer::OptimizeOptions;
using infer::Precision;

bool any_pass_contains(const infer::OptimizeResult& result, const std::string& text) {
  for (const auto& pass : result.passes) {
    if (pass.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(Optimize, FoldsBatchNormAndRemovesDropoutKeepingOutputs) {
  auto model = conv_bn_dropout_model();
  auto input = torch::randn({16, 1, 8, 8});
  model.eval();
  auto expected = answer(model, input);
  model.train();  // as saved by a user who forgot eval(): optimize must still serve inference

  auto result = infer::optimize(model);
  EXPECT_TRUE(torch::allclose(answer(result.model, input), expected, 1e-4, 1e-5));
  EXPECT_FALSE(graph_has(result.model, "aten::batch_norm"));
  EXPECT_FALSE(graph_has(result.model, "aten::dropout"));
  EXPECT_TRUE(any_pass_contains(result, "dropout removal: 1 of 1 removed"));
  EXPECT_TRUE(any_pass_contains(result, "BatchNorm: 1 of 1 removed"));
  auto prepared = infer::prepare_for_inference(result.model);
  EXPECT_TRUE(torch::allclose(answer(prepared, input), expected, 1e-4, 1e-5));
  EXPECT_TRUE(graph_has(model, "aten::batch_norm")) << "the input model must stay as it was";
  EXPECT_TRUE(model.is_training());
}

TEST(Optimize, Bf16FoldsBatchNormToo) {
  auto model = conv_bn_dropout_model();
  model.eval();
  auto input = torch::randn({16, 1, 8, 8});
  auto expected = answer(model, input);
  auto result = infer::optimize(model, OptimizeOptions().precision(Precision::bf16));
  EXPECT_FALSE(graph_has(result.model, "aten::batch_norm"));
  EXPECT_FALSE(graph_has(result.model, "aten::dropout"));
  // bf16 keeps 8 significant bits: logits of size ~1 move by a few 1e-3 per rounding.
  EXPECT_TRUE(torch::allclose(answer(result.model, input), expected, 0.05, 0.05));
}

TEST(Optimize, Fp32ZooModelsMatchTheirExport) {
  auto input = fashion_mnist_images("t10k", 64);
  for (const std::string name : {"mlp", "cnn"}) {
    auto model = trained_zoo_model(name);
    auto result = infer::optimize(model);
    auto prepared = infer::prepare_for_inference(result.model);
    EXPECT_TRUE(torch::allclose(answer(result.model, input), answer(model, input), 1e-4, 1e-4)) << name;
    EXPECT_TRUE(torch::allclose(answer(prepared, input), answer(model, input), 1e-4, 1e-4)) << name;
  }
  // The convolutions run on oneDNN's layout once prepared.
  auto cnn = infer::optimize(trained_zoo_model("cnn")).model;
  EXPECT_FALSE(graph_has(cnn, "prim::mkldnn_convolution"));
  EXPECT_TRUE(graph_has(infer::prepare_for_inference(cnn), "prim::mkldnn_convolution"));
}

TEST(Optimize, SavedModelLoadsAndComputesTheSame) {
  auto input = fashion_mnist_images("t10k", 32);
  for (const std::string name : {"mlp", "cnn"}) {
    for (auto precision : {Precision::fp32, Precision::bf16, Precision::int8}) {
      auto result = infer::optimize(trained_zoo_model(name), OptimizeOptions().precision(precision));
      TempDir dir;
      const auto path = (dir / "model.pt").string();
      infer::save_model(result.model, path);
      auto loaded = infer::load_model(path);
      const auto label = name + " " + infer::to_string(precision);
      EXPECT_TRUE(torch::equal(answer(loaded, input), answer(result.model, input))) << label;
      // oneDNN's kernels round differently from ATen's, by up to a bf16 ulp of the logits in bf16.
      auto prepared = infer::load_optimized(path);
      const double tolerance = precision == Precision::bf16 ? 0.1 : 1e-4;
      EXPECT_TRUE(torch::allclose(answer(prepared, input), answer(result.model, input), tolerance, tolerance))
          << label;
    }
  }
}

// Top-1 agreement with the fp32 model on 2000 real test images, against the targets.
double top1_agreement(const std::string& name, Precision precision) {
  auto model = trained_zoo_model(name);
  auto images = fashion_mnist_images("t10k", 2000);
  auto result = infer::optimize(model, OptimizeOptions().precision(precision));
  auto expected = answer(model, images).argmax(1);
  auto actual = answer(result.model, images).argmax(1);
  return expected.eq(actual).to(torch::kDouble).mean().item<double>();
}

TEST(Optimize, Bf16AgreesWithFp32) {
  EXPECT_GE(top1_agreement("cnn", Precision::bf16), 0.995);
  EXPECT_TRUE(graph_has(infer::optimize(trained_zoo_model("cnn"), OptimizeOptions().precision(Precision::bf16)).model,
                        "aten::to"));
}

TEST(Optimize, Int8QuantizesLinearsAndAgreesWithFp32) {
  auto result = infer::optimize(trained_zoo_model("mlp"), OptimizeOptions().precision(Precision::int8));
  EXPECT_TRUE(graph_has(result.model, "quantized::linear_dynamic"));
  EXPECT_FALSE(graph_has(result.model, "aten::linear"));
  EXPECT_TRUE(any_pass_contains(result, "int8: 3 Linear layers"));
  EXPECT_GE(top1_agreement("mlp", Precision::int8), 0.99);
}

// A convolution of x by a weight of `weight_shape` (no bias) whose call is `convolution`, in a
// module with a training attribute as Python saves one (prepare_for_inference then freezes it,
// as serve's copy of a file is frozen).
torch::jit::Module convolution_model(const std::string& convolution, std::vector<int64_t> weight_shape = {4, 1, 3, 3}) {
  torch::jit::Module model("__torch__.Convolution");
  model.register_attribute("training", c10::BoolType::get(), false);
  model.register_parameter("weight", torch::randn(weight_shape), false);
  model.define("def forward(self, x):\n    return " + convolution + "\n");
  return model;
}

// LibTorch's optimize_for_inference lays each convolution's weight out for oneDNN from its
// shape, stride, padding, dilation and groups, unchecked, and runs the max pooling after it on
// oneDNN without eager's checks: a stride of 0 divided by zero (SIGFPE, in the layout and in
// pooling's first forward), a 1-D weight was read past its end and a convolution whose bias was
// its weight dereferenced an empty optional (SIGSEGV); Python's torch.jit.optimize_for_inference
// does the same. Arguments eager refuses when the model runs
// are refused before, in one line naming them, for a model as served (unfrozen) and as optimized
// (frozen).
TEST(PrepareForInference, RefusesConvolutionsOneDnnCannotLayOut) {
  struct Case {
    std::string convolution;
    std::vector<int64_t> weight_shape;
    std::string expected;
  };
  const std::vector<int64_t> kernel{4, 1, 3, 3};
  const std::vector<Case> cases = {
      {"torch.conv2d(x, self.weight, None, [1, 0])", kernel,
       "aten::conv2d with stride [1, 0] is not supported: stride must be at least 1"},
      {"torch.conv2d(x, self.weight, None, [-2, 1])", kernel, "aten::conv2d with stride [-2, 1] is not supported"},
      {"torch.conv2d(x, self.weight, None, [2])", kernel,
       "aten::conv2d with stride [2] is not supported: stride must have 2 values"},
      {"torch.conv2d(x, self.weight, None, [1, 1], [-1, 1])", kernel,
       "aten::conv2d with padding [-1, 1] is not supported: padding must be at least 0"},
      {"torch.conv2d(x, self.weight, None, [1, 1], [1, 1], [0, 1])", kernel,
       "aten::conv2d with dilation [0, 1] is not supported: dilation must be at least 1"},
      {"torch.conv2d(x, self.weight, None, [1, 1], [1, 1], [1, 1], 0)", kernel,
       "aten::conv2d with groups 0 is not supported: groups must be at least 1 and divide the weight's 4 output "
       "channels"},
      {"torch.conv2d(x, self.weight, None, [1, 1], [1, 1], [1, 1], 3)", kernel, "aten::conv2d with groups 3"},
      {"torch.conv2d(x, self.weight, self.weight)", kernel,
       "aten::conv2d with a bias of shape [4, 1, 3, 3] is not supported: its bias must have one value per output "
       "channel, 4"},
      {"torch.conv2d(x, self.weight)", {6},
       "aten::conv2d with a weight of shape [6] is not supported: its weight must have 4 dimensions"},
      {"torch._convolution(x, self.weight, None, [0, 0], [0, 0], [1, 1], False, [0, 0], 1, False, False, True, True)",
       kernel, "aten::_convolution with stride [0, 0] is not supported"},
      {"torch._convolution(x, self.weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, False, False, True, True)",
       {4, 1, 3}, "aten::_convolution with stride [1, 1] is not supported: stride must have 1 value"},
      {"torch.max_pool2d(torch.conv2d(x, self.weight), [2, 2], [0, 0])", kernel,
       "aten::max_pool2d with stride [0, 0] is not supported: stride must be at least 1"},
      {"torch.max_pool2d(torch.conv2d(x, self.weight), [0, 0])", kernel,
       "aten::max_pool2d with kernel_size [0, 0] is not supported: kernel_size must be at least 1"},
      {"torch.max_pool2d(torch.conv2d(x, self.weight), [2, 2], [2, 2], [5, 5])", kernel,
       "aten::max_pool2d with padding [5, 5] is not supported: padding must be at most half of kernel_size [2, 2]"},
      {"torch.max_pool2d(torch.conv2d(x, self.weight), [2, 2, 2])", kernel,
       "aten::max_pool2d with kernel_size [2, 2, 2] is not supported: kernel_size must have 1 or 2 values"}};
  for (const Case& c : cases) {
    torch::jit::Module model = convolution_model(c.convolution, c.weight_shape);
    for (const torch::jit::Module& given : {model, infer::optimize(model).model}) {
      const std::string message = error_message<Error>([&] { infer::prepare_for_inference(given); });
      EXPECT_TRUE(Contains(message, "infer: " + c.expected)) << c.convolution;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  // Valid arguments are laid out for oneDNN and compute as before (pooling's single values and
  // empty stride too).
  torch::jit::Module model = convolution_model(
      "torch.max_pool2d(torch.conv2d(x, self.weight, None, [2, 1], [0, 1], [1, 2]), [2], [], [1], [1])");
  const torch::Tensor input = torch::randn({3, 1, 8, 8});
  auto prepared = infer::prepare_for_inference(model);
  EXPECT_TRUE(graph_has(prepared, "prim::mkldnn_convolution"));
  EXPECT_TRUE(torch::allclose(answer(prepared, input), answer(model, input), 1e-5, 1e-5));
}

// torch.clamp(conv(x), min=0.0), a common form of ReLU, and clamps with an integer bound stopped
// LibTorch's optimize_for_inference ("isDouble() INTERNAL ASSERT FAILED", Python's too): each
// bound becomes a float before it runs, and the answers stay the module's, NaN and infinities
// included; a clamp of integers keeps its integer result.
TEST(PrepareForInference, ClampsOfConvolutionsWithNoneOrIntegerBounds) {
  for (const char* clamp : {"torch.clamp(y, 0.0)", "torch.clamp(y, None, 1.0)", "torch.clamp(y, 0, 6)",
                            "torch.clamp_(y, -1, None)", "torch.clamp(torch.relu(y) * 2.0, max=3)"}) {
    SCOPED_TRACE(clamp);
    torch::manual_seed(7);
    torch::jit::Module model("__torch__.Clamped");
    model.register_attribute("training", c10::BoolType::get(), false);
    model.register_parameter("weight", torch::randn({4, 1, 3, 3}), false);
    model.define(std::string("def forward(self, x):\n    y = torch.conv2d(x, self.weight)\n    return ") + clamp +
                 "\n");
    const torch::Tensor x = images_with_non_finite({1, 8, 8}, 20);
    auto prepared = infer::prepare_for_inference(model);
    EXPECT_FALSE(graph_has(prepared, "aten::conv2d")) << "the convolution runs on oneDNN";
    EXPECT_TRUE(AgreesWithNonFinite(answer(prepared, x), answer(model, x), 1e-5, 1e-5));
  }
  torch::jit::Module integers("__torch__.Integers");
  integers.register_attribute("training", c10::BoolType::get(), false);
  integers.define("def forward(self, x):\n    return torch.clamp(x, 0, 6)\n");
  const torch::Tensor counts = torch::arange(-3, 9);
  torch::jit::Module prepared = infer::prepare_for_inference(integers);
  EXPECT_TRUE(torch::equal(answer(prepared, counts), counts.clamp(0, 6)));
}

// After a convolution, LibTorch's optimize_for_inference moves average poolings to oneDNN, which
// counts a ceil_mode window's overhang past the input as padding (AvgPool2d(2, 2, ceil_mode=True)
// on an odd size answered 0.56 off, Python's too) and has no divisor_override (the first call
// failed). The prepared model answers as the module, NaN and infinities included, at odd and even
// sizes, twice the same; the poolings oneDNN computes as ATen stay on it.
TEST(PrepareForInference, AveragePoolingsOfConvolutionsAsATenCounts) {
  const std::vector<std::pair<const char*, bool>> poolings{
      {"torch.avg_pool2d(y, [2, 2], [2, 2], [0, 0], True)", true},
      {"torch.avg_pool2d(y, [3, 3], [2, 2], [0, 0], True, True)", true},
      {"torch.avg_pool2d(y, [2, 2], [2, 2], [0, 0], True, False)", true},
      {"torch.avg_pool2d(y, [3, 3], [2, 2], [1, 1], True, True)", false},
      {"torch.avg_pool2d(y, [2, 2], [2, 2], [0, 0], False, True, 3)", false},
      {"torch.avg_pool2d(y, [3, 3], [2, 2], [1, 1])", true}};
  for (const auto& [pooling, on_onednn] : poolings) {
    for (const int64_t size : {7, 8}) {
      SCOPED_TRACE(fmt::format("{}, size {}", pooling, size));
      torch::manual_seed(size);
      torch::jit::Module model("__torch__.Pooled");
      model.register_attribute("training", c10::BoolType::get(), false);
      model.register_parameter("weight", torch::randn({8, 3, 3, 3}), false);
      model.define(fmt::format("def forward(self, x):\n    y = torch.conv2d(x, self.weight, None, [1, 1], [1, 1])\n"
                               "    return {}\n",
                               pooling));
      auto prepared = infer::prepare_for_inference(model);
      EXPECT_EQ(graph_has(prepared, "afterburner::avg_pool2d_as_aten"), !on_onednn);
      const torch::Tensor x = images_with_non_finite({3, size, size}, 20);
      const torch::Tensor first = answer(prepared, x);
      EXPECT_TRUE(AgreesWithNonFinite(first, answer(model, x), 1e-5, 1e-5));
      EXPECT_TRUE(BitwiseEqual(answer(prepared, x), first)) << "a second call answered otherwise";
    }
  }
}

TEST(Optimize, PrecisionNamesRoundTripAndBadOnesNameTheField) {
  for (auto precision : {Precision::fp32, Precision::bf16, Precision::int8}) {
    EXPECT_EQ(infer::parse_precision(infer::to_string(precision)), precision);
  }
  auto message = error_message<UsageError>([] { infer::parse_precision("fp16"); });
  EXPECT_TRUE(Contains(message, "precision"));
  EXPECT_TRUE(Contains(message, "fp16"));
}

}  // namespace
}  // namespace afterburner::testing
