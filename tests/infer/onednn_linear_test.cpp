// route_matmuls_to_onednn: which products it rewrites, and that the rewritten graph computes
// what the original computes for every input rank.
#include "afterburner/infer/onednn_linear.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/script.h>

#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "test_models.h"
#include "testing.h"

namespace afterburner::infer {
namespace {
namespace jit = torch::jit;

// A frozen module whose forward runs `statements` on x, a weight w [16, 8] and a bias b [8] of
// `dtype`.
jit::Module frozen_forward(const std::string& statements, torch::Dtype dtype = torch::kFloat) {
  jit::Module module("__torch__.Products");
  module.register_parameter("w", torch::randn({16, 8}, dtype), false);
  module.register_parameter("b", torch::randn({8}, dtype), false);
  module.define("def forward(self, x):\n" + statements);
  module.eval();
  return jit::freeze(module);
}

// The same, returning the expression `body`.
jit::Module frozen(const std::string& body, torch::Dtype dtype = torch::kFloat) {
  return frozen_forward("    return " + body + "\n", dtype);
}

// Rewrites the module's graph and checks its outputs against a copy of the module left as it was
// (bf16: within a few of its roundings). The rewrite comes before the module's first call:
// TorchScript's executor keeps the plan of a graph's first calls.
int route_and_compare(jit::Module& module, torch::Dtype dtype = torch::kFloat) {
  const double tolerance = dtype == torch::kBFloat16 ? 3e-2 : 1e-5;
  const jit::Module original = module.clone();
  auto graph = module.get_method("forward").graph();
  const int routed = route_matmuls_to_onednn(graph);
  const std::vector<std::vector<int64_t>> shapes{{5, 16}, {2, 3, 16}, {16}};
  std::vector<torch::Tensor> inputs, expected;
  torch::NoGradGuard no_grad;
  for (const auto& shape : shapes) {
    inputs.push_back(torch::randn(shape, dtype));
    expected.push_back(jit::Module(original).forward({inputs.back()}).toTensor());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const torch::Tensor actual = module.forward({inputs[i]}).toTensor();
    EXPECT_EQ(actual.sizes(), expected[i].sizes());
    EXPECT_EQ(actual.scalar_type(), expected[i].scalar_type());
    EXPECT_TRUE(torch::allclose(actual, expected[i], tolerance, tolerance)) << "input " << inputs[i].sizes();
  }
  return routed;
}

// A Linear layer, and a transformer MLP's Linear + GELU (one oneDNN product with the bias and
// gelu applied as it writes its output), in fp32 and bf16.
TEST(OnednnLinear, ALinearLayerWithOrWithoutGeluBecomesOneCall) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const bool gelu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype << (gelu ? ", gelu" : ""));
      torch::manual_seed(1);
      const std::string linear = "torch.matmul(x, self.w) + self.b";
      jit::Module module = frozen(gelu ? "torch.gelu(" + linear + ")" : linear, dtype);
      EXPECT_EQ(route_and_compare(module, dtype), 1);
      EXPECT_TRUE(testing::graph_has(module, gelu ? "afterburner::linear_gelu" : "afterburner::linear"));
      EXPECT_FALSE(testing::graph_has(module, "aten::gelu"));
      EXPECT_FALSE(testing::graph_has(module, "aten::add"));
    }
  }
}

// GELU's tanh form, and a pre-activation something else reads too, keep their own gelu.
TEST(OnednnLinear, GeluStaysWhereItCannotJoinTheProduct) {
  torch::manual_seed(7);
  jit::Module tanh_form = frozen("torch.gelu(torch.matmul(x, self.w) + self.b, approximate='tanh')");
  EXPECT_EQ(route_and_compare(tanh_form), 1);
  EXPECT_TRUE(testing::graph_has(tanh_form, "afterburner::linear"));
  EXPECT_TRUE(testing::graph_has(tanh_form, "aten::gelu"));
  jit::Module shared = frozen_forward(
      "    z = torch.matmul(x, self.w) + self.b\n"
      "    return torch.gelu(z) + z\n");
  EXPECT_EQ(route_and_compare(shared), 1);
  EXPECT_TRUE(testing::graph_has(shared, "afterburner::linear"));
  EXPECT_FALSE(testing::graph_has(shared, "afterburner::linear_gelu"));
  EXPECT_TRUE(testing::graph_has(shared, "aten::gelu"));
}

TEST(OnednnLinear, AProductWithoutItsBiasKeepsTheRest) {
  torch::manual_seed(2);
  jit::Module scaled = frozen("torch.matmul(x, self.w) * 2.0");
  EXPECT_EQ(route_and_compare(scaled), 1);
  EXPECT_TRUE(testing::graph_has(scaled, "afterburner::mm"));
  jit::Module alpha = frozen("torch.add(torch.matmul(x, self.w), self.b, alpha=2)");  // not a bias
  EXPECT_EQ(route_and_compare(alpha), 1);
  EXPECT_TRUE(testing::graph_has(alpha, "afterburner::mm"));
  EXPECT_TRUE(testing::graph_has(alpha, "aten::add"));
}

TEST(OnednnLinear, OtherProductsStayAsTheyAre) {
  torch::manual_seed(3);
  jit::Module variable = frozen("torch.matmul(x, self.w + x.sum()) + self.b");  // a computed weight
  EXPECT_EQ(route_and_compare(variable), 0);
  jit::Module lone_bf16 = frozen("torch.matmul(x, self.w)", torch::kBFloat16);  // LibTorch's is oneDNN's already
  EXPECT_EQ(route_and_compare(lone_bf16, torch::kBFloat16), 0);
  jit::Module doubles = frozen("torch.matmul(x, self.w) + self.b", torch::kDouble);
  EXPECT_EQ(route_and_compare(doubles, torch::kDouble), 0);
  EXPECT_FALSE(testing::graph_has(doubles, "afterburner::linear"));
}

// An fp32 mlp as a server loads it: every Linear layer on oneDNN, the same logits.
TEST(OnednnLinear, PreparedFp32ModelsRouteEveryLinearLayer) {
  torch::manual_seed(4);
  testing::TempDir dir;
  models::export_torchscript(models::make_model("mlp"), (dir / "mlp.pt").string());
  const auto optimized = optimize(load_model((dir / "mlp.pt").string())).model;
  jit::Module prepared = prepare_for_inference(optimized);
  EXPECT_TRUE(testing::graph_has(prepared, "afterburner::linear"));
  EXPECT_FALSE(testing::graph_has(prepared, "aten::matmul"));
  const torch::Tensor x = torch::randn({7, 1, 28, 28});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(jit::Module(prepared).forward({x}).toTensor(),
                              jit::Module(optimized).forward({x}).toTensor(), 1e-4, 1e-5));
}

}  // namespace
}  // namespace afterburner::infer
