// sketch_script on TorchScript files written by Python: which layers it replaces, that the
// replacements hold their dense layers' sketches and compute the definition, and that Python
// runs the result.
#include "afterburner/sketch/script.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <map>

#include "afterburner/core/error.h"
#include "reference.h"
#include "testing.h"

namespace afterburner::sketch {
namespace {
namespace jit = torch::jit;
using afterburner::testing::Contains;
using afterburner::testing::TempDir;

const char* const kPython = "/usr/bin/python3";

class SketchScript : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    models_ = new TempDir;
    auto made = afterburner::testing::run(
        {kPython, (afterburner::testing::source_dir() / "tests" / "sketch" / "script_models.py").string(),
         models_->path().string()});
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  static void TearDownTestSuite() { delete models_; }

  static jit::Module load(const std::string& name) { return jit::load((*models_ / (name + ".pt")).string()); }
  static torch::Tensor input_of(const std::string& name) {
    return jit::load((*models_ / (name + "_io.pt")).string()).attr("input").toTensor();
  }

  static std::map<std::string, LayerPlan> by_name(const SketchReport& report) {
    std::map<std::string, LayerPlan> layers;
    for (const auto& layer : report.layers) layers.emplace(layer.name, layer);
    return layers;
  }

  // Python's torch.jit.load runs the sketched model and reproduces the C++ output.
  static void expect_python_agrees(const jit::Module& sketched, const torch::Tensor& input) {
    TempDir dir;
    sketched.save((dir / "sketched.pt").string());
    torch::NoGradGuard no_grad;
    jit::Module fixture("Fixture");
    fixture.register_buffer("input", input);
    fixture.register_buffer("output", jit::load((dir / "sketched.pt").string()).forward({input}).toTensor());
    fixture.save((dir / "io.pt").string());
    auto checked = afterburner::testing::run(
        {kPython, (afterburner::testing::source_dir() / "bench" / "export_reference.py").string(), "--check",
         (dir / "sketched.pt").string(), (dir / "io.pt").string(), "--tolerance", "1e-5"});
    EXPECT_EQ(checked.exit_code, 0) << checked.out << checked.err;
  }

  static TempDir* models_;
};

TempDir* SketchScript::models_ = nullptr;

jit::Module child(const jit::Module& model, const std::string& path) {
  jit::Module module = model;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('.', start), path.size());
    module = module.attr(path.substr(start, end - start)).toModule();
    start = end + 1;
  }
  return module;
}

torch::Tensor tensor(const jit::Module& module, const std::string& name) { return module.attr(name).toTensor(); }

// The layer's output on x against the definition computed from its own tensors in double.
void expect_linear_definition(const jit::Module& layer, const torch::Tensor& x, bool with_bias) {
  auto d = [&](const char* name) { return tensor(layer, name).to(torch::kDouble); };
  const torch::Tensor expected =
      reference::sklinear(x.to(torch::kDouble), d("S1s"), d("S2s"), d("U1s"), d("U2s"), with_bias ? d("bias") : torch::Tensor());
  torch::NoGradGuard no_grad;
  EXPECT_LE(reference::relative_error(jit::Module(layer).forward({x}).toTensor(), expected), 1e-5);
}

void expect_conv_definition(const jit::Module& layer, std::vector<int64_t> input_shape, torch::IntArrayRef stride,
                            torch::IntArrayRef padding) {
  auto d = [&](const char* name) { return tensor(layer, name).to(torch::kDouble); };
  const torch::Tensor x = torch::randn(input_shape, torch::kDouble);
  const torch::Tensor expected = reference::skconv2d(x, d("S1s"), d("U1s"), d("bias"), stride, padding);
  torch::NoGradGuard no_grad;
  EXPECT_LE(reference::relative_error(jit::Module(layer).forward({x.to(torch::kFloat)}).toTensor(), expected), 1e-5);
}

TEST_F(SketchScript, ReplacesTheLinearLayersWhoseSketchCostsLess) {
  jit::Module model = load("blocks");
  const jit::Module original = load("blocks");
  auto report = sketch_script(model, SketchConfig().terms(1).rank(4));
  auto layers = by_name(report);
  ASSERT_EQ(layers.size(), 4u);
  for (const char* name : {"a.fc", "b.fc", "head.0"}) EXPECT_TRUE(layers[name].replaced()) << name << ": " << layers[name].kept_because;
  EXPECT_TRUE(Contains(layers["head.2"].kept_because, "rank 4 would not save: 2Lk(d_in + d_out) = 336 > d_in d_out = 320"));
  EXPECT_EQ(layers["a.fc"].sketched_params, 4 * (64 + 64) + 64);
  EXPECT_EQ(report.replaced_count(), 3);

  int64_t trainable = 0;
  for (const auto& p : model.parameters()) trainable += p.numel();
  EXPECT_EQ(report.params_after, trainable);
  EXPECT_EQ(report.params_before - report.params_after, 2 * (64 * 64 - 4 * 128) + (32 * 64 - 4 * 96));

  const jit::Module fc = child(model, "a.fc");
  EXPECT_EQ(tensor(fc, "S1s").sizes(), (std::vector<int64_t>{1, 64, 4}));
  EXPECT_EQ(tensor(fc, "S2s").sizes(), (std::vector<int64_t>{1, 4, 64}));
  EXPECT_EQ(tensor(fc, "U1s").sizes(), (std::vector<int64_t>{1, 4, 64}));
  EXPECT_EQ(tensor(fc, "U2s").sizes(), (std::vector<int64_t>{1, 64, 4}));
  // Initialised from the dense weight W = weight^T: S1 = W U1^T, S2 = U2^T W; the bias is kept.
  const torch::Tensor w = tensor(child(original, "a.fc"), "weight").t();
  EXPECT_TRUE(torch::allclose(tensor(fc, "S1s")[0], w.mm(tensor(fc, "U1s")[0].t()), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(tensor(fc, "S2s")[0], tensor(fc, "U2s")[0].t().mm(w), 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(tensor(fc, "bias"), tensor(child(original, "a.fc"), "bias")));
  EXPECT_TRUE(torch::equal(tensor(child(model, "head.2"), "weight"), tensor(child(original, "head.2"), "weight")));

  EXPECT_EQ(fc.named_parameters(false).size(), 3u);  // S1s, S2s, bias; the U buffers are not trained
  const torch::Tensor x = torch::randn({5, 64});
  expect_linear_definition(fc, x, true);
  expect_linear_definition(child(model, "head.0"), x, true);
  expect_python_agrees(model, input_of("blocks"));
}

TEST_F(SketchScript, ABudgetChoosesTheLargestRankWithinIt) {
  jit::Module model = load("blocks");
  auto layers = by_name(sketch_script(model, SketchConfig().terms(2).budget(0.25)));
  // a.fc: L(d_in + d_out) = 256 weights per unit of rank, a quarter of 4096 allows rank 4.
  EXPECT_EQ(layers["a.fc"].rank, 4);
  EXPECT_EQ(tensor(child(model, "a.fc"), "S1s").sizes(), (std::vector<int64_t>{2, 64, 4}));
  EXPECT_LE(layers["head.0"].sketched_params - 32, 0.25 * 32 * 64);
  EXPECT_TRUE(Contains(layers["head.2"].kept_because, "allows no rank-1 sketch"));
}

TEST_F(SketchScript, ReplacesConvolutionsAndKeepsGroupedOnes) {
  jit::Module model = load("convs");
  auto layers = by_name(sketch_script(model, SketchConfig().terms(1).rank(2)));
  EXPECT_TRUE(layers["0"].replaced());
  EXPECT_TRUE(layers["2"].replaced());
  EXPECT_TRUE(Contains(layers["4"].kept_because, "grouped convolutions are not sketched"));

  const jit::Module strided = child(model, "2");
  EXPECT_EQ(tensor(strided, "S1s").sizes(), (std::vector<int64_t>{4, 16, 5, 5}));  // [2Lk, C_in, Kh, Kw]
  EXPECT_EQ(tensor(strided, "U1s").sizes(), (std::vector<int64_t>{2, 2, 32}));     // [2L, k, C_out]
  expect_conv_definition(strided, {2, 16, 9, 9}, {2, 2}, {2, 2});
  expect_python_agrees(model, input_of("convs"));
}

// Python gives layers of different sizes different classes; TorchScript built otherwise may
// not. A module of class Block with a 64 x 64 layer and one with an 8 x 8 layer of one class.
jit::Module blocks_of_one_class() {
  auto unit = std::make_shared<jit::CompilationUnit>();
  c10::ClassTypePtr linear_type, block_type;
  auto block = [&](int64_t width) {
    jit::Module linear = linear_type ? jit::Module(unit, linear_type) : jit::Module("__torch__.Linear", unit, true);
    linear.register_parameter("weight", torch::randn({width, width}), false);
    linear.register_parameter("bias", torch::randn({width}), false);
    if (!linear_type) linear.define("def forward(self, x):\n    return torch.linear(x, self.weight, self.bias)\n");
    linear_type = linear.type();
    jit::Module out = block_type ? jit::Module(unit, block_type) : jit::Module("__torch__.Block", unit, true);
    out.register_module("fc", linear);
    if (!block_type) out.define("def forward(self, x):\n    return torch.relu(self.fc.forward(x))\n");
    block_type = out.type();
    return out;
  };
  jit::Module model("__torch__.Top", unit, true);
  model.register_module("wide", block(64));
  model.register_module("narrow", block(8));
  model.define("def forward(self, x):\n    return self.wide.forward(x).sum() + self.narrow.forward(x[:, :8]).sum()\n");
  return model;
}

TEST_F(SketchScript, TracedModelsAreSketchedToo) {
  jit::Module model = load("traced");
  auto layers = by_name(sketch_script(model, SketchConfig().rank(2)));
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_TRUE(layers["0"].replaced());  // traced as aten::_convolution
  EXPECT_TRUE(layers["3"].replaced());
  expect_conv_definition(child(model, "0"), {2, 1, 28, 28}, {2, 2}, {1, 1});
  expect_python_agrees(model, input_of("traced"));
}

// The model in memory runs its sketched layers, not only its saved file: examining the block for
// a dense layer had cached its shortcut Sequential's forward with the dense layer inlined, which
// then ran on the sketched layer's tensors (in the zoo's resnet, "running_mean should contain 8
// elements not 64").
TEST_F(SketchScript, ALayerTwoModulesDownRunsSketchedInMemory) {
  jit::Module model = load("nested");
  auto layers = by_name(sketch_script(model, SketchConfig().rank(4)));
  EXPECT_TRUE(layers["block.main"].replaced());
  ASSERT_TRUE(layers["block.shortcut.0"].replaced());
  const torch::Tensor x = input_of("nested");
  TempDir dir;
  model.save((dir / "sketched.pt").string());
  torch::NoGradGuard no_grad;
  const torch::Tensor from_file = jit::load((dir / "sketched.pt").string()).forward({x}).toTensor();
  EXPECT_TRUE(torch::allclose(model.forward({x}).toTensor(), from_file, 1e-6, 1e-6));
  expect_linear_definition(child(model, "block.shortcut.0"), x, true);
}

TEST_F(SketchScript, LayersSharingAClassWithAKeptLayerAreKept) {
  jit::Module model = blocks_of_one_class();
  ASSERT_EQ(child(model, "wide").type(), child(model, "narrow").type());
  auto report = sketch_script(model, SketchConfig().rank(4));
  auto layers = by_name(report);
  EXPECT_TRUE(Contains(layers["narrow.fc"].kept_because, "rank 4 would not save"));
  EXPECT_TRUE(Contains(layers["wide.fc"].kept_because, "shares its TorchScript class with narrow.fc, which is kept"));
  EXPECT_EQ(report.params_after, report.params_before);
  torch::NoGradGuard no_grad;
  EXPECT_NO_THROW(model.forward({torch::randn({2, 64})}));
}

TEST_F(SketchScript, ALayerTheParentReadsIntoIsKept) {
  jit::Module model = load("peeks");
  auto report = sketch_script(model, SketchConfig().rank(4));
  ASSERT_EQ(report.layers.size(), 1u);
  EXPECT_TRUE(Contains(report.layers[0].kept_because, "forward uses the module other than by calling it"));
  EXPECT_EQ(report.params_after, report.params_before);
}

TEST(SketchConfig, BadConfigsNameTheField) {
  using afterburner::testing::error_message;
  jit::Module model("Empty");
  auto message = [&](const SketchConfig& config) { return error_message<UsageError>([&] { sketch_script(model, config); }); };
  EXPECT_TRUE(Contains(message(SketchConfig()), "sketch budget: give a rank or a budget"));
  EXPECT_TRUE(Contains(message(SketchConfig().rank(4).budget(0.5)), "sketch rank: give a rank or a budget, not both"));
  EXPECT_TRUE(Contains(message(SketchConfig().budget(1.5)), "sketch budget: must be in (0, 1), got 1.5"));
  EXPECT_TRUE(Contains(message(SketchConfig().rank(4).terms(0)), "sketch terms: must be at least 1, got 0"));
  EXPECT_TRUE(Contains(message(SketchConfig().rank(-1)), "sketch rank: must be at least 1, got -1"));
  EXPECT_TRUE(Contains(message(SketchConfig().attention_features(-2)),
                       "sketch attention features: must be at least 1, got -2"));
  EXPECT_NO_THROW(sketch_script(model, SketchConfig().attention_features(16)));
}

}  // namespace
}  // namespace afterburner::sketch
