#include "afterburner/infer/onednn_linear.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>
#include <torch/library.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace afterburner::infer {

torch::Tensor linear_on_onednn(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                               kernels::Epilogue epilogue) {
  const torch::Tensor rows = x.reshape({-1, x.size(-1)});
  const bool sgemm = x.scalar_type() == torch::kFloat && epilogue == kernels::Epilogue::identity;
  const torch::Tensor y = !bias.defined() ? kernels::mm(rows, weight)
                          : sgemm         ? kernels::addmm(bias, rows, weight)
                                          : kernels::addmm_fused(bias, rows, weight, epilogue);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(1);
  return y.view(sizes);
}

namespace {

namespace jit = torch::jit;

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.def("linear(Tensor x, Tensor weight, Tensor bias) -> Tensor",
        [](const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
          return linear_on_onednn(x, weight, bias);
        });
  m.def("linear_gelu(Tensor x, Tensor weight, Tensor bias) -> Tensor",
        [](const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
          return linear_on_onednn(x, weight, bias, kernels::Epilogue::gelu);
        });
  m.def("mm(Tensor x, Tensor weight) -> Tensor",
        [](const torch::Tensor& x, const torch::Tensor& weight) { return linear_on_onednn(x, weight, {}); });
}

using Values = std::unordered_map<std::string, jit::Value*>;

// The match's constant tensor `name` of `dim` dimensions, fp32 or bf16, on the CPU.
c10::optional<torch::Tensor> constant_tensor(const jit::Match& match, const Values& values, const char* name,
                                             int64_t dim) {
  auto constant = jit::toIValue(match.values_map.at(values.at(name)));
  if (!constant || !constant->isTensor()) return c10::nullopt;
  torch::Tensor tensor = constant->toTensor();
  const bool dtype = tensor.scalar_type() == torch::kFloat || tensor.scalar_type() == torch::kBFloat16;
  if (tensor.dim() != dim || !dtype || !tensor.device().is_cpu()) return c10::nullopt;
  return tensor;
}

// A constant fp32 matrix: bf16 lone products stay LibTorch's (kernels::mm would hand them back).
bool has_constant_weight(const jit::Match& match, const Values& values) {
  const auto weight = constant_tensor(match, values, "weight", 2);
  return weight && weight->scalar_type() == torch::kFloat;
}

// A constant weight matrix and a constant bias vector of its width and dtype, alpha 1.
bool has_constant_weight_and_bias(const jit::Match& match, const Values& values) {
  const auto weight = constant_tensor(match, values, "weight", 2);
  const auto bias = constant_tensor(match, values, "bias", 1);
  const auto alpha = jit::toIValue(match.values_map.at(values.at("alpha")));
  return weight && bias && bias->size(0) == weight->size(1) && bias->scalar_type() == weight->scalar_type() &&
         alpha && alpha->isInt() && alpha->toInt() == 1;
}

// As above, then gelu of the erf form (approximate "none"; the tanh form stays LibTorch's).
bool has_constant_weight_and_bias_then_gelu(const jit::Match& match, const Values& values) {
  const auto approximate = jit::toIValue(match.values_map.at(values.at("approximate")));
  return has_constant_weight_and_bias(match, values) && approximate && approximate->isString() &&
         approximate->toStringRef() == "none";
}

int count_matmuls(const std::shared_ptr<jit::Graph>& graph) {
  int count = 0;
  jit::DepthFirstGraphNodeIterator nodes(const_cast<std::shared_ptr<jit::Graph>&>(graph));
  for (const jit::Node* node = nodes.next(); node; node = nodes.next()) count += node->kind() == c10::aten::matmul;
  return count;
}

}  // namespace

int route_matmuls_to_onednn(std::shared_ptr<jit::Graph>& graph) {
  const int before = count_matmuls(graph);
  jit::SubgraphRewriter then_gelu;
  then_gelu.RegisterRewritePattern(R"(
graph(%x, %weight, %bias, %alpha, %approximate):
  %product = aten::matmul(%x, %weight)
  %z = aten::add(%product, %bias, %alpha)
  %y = aten::gelu(%z, %approximate)
  return (%y))",
                                   R"(
graph(%x, %weight, %bias, %alpha, %approximate):
  %y = afterburner::linear_gelu(%x, %weight, %bias)
  return (%y))");
  then_gelu.runOnGraph(graph, has_constant_weight_and_bias_then_gelu);
  jit::SubgraphRewriter with_bias;
  with_bias.RegisterRewritePattern(R"(
graph(%x, %weight, %bias, %alpha):
  %product = aten::matmul(%x, %weight)
  %y = aten::add(%product, %bias, %alpha)
  return (%y))",
                                   R"(
graph(%x, %weight, %bias, %alpha):
  %y = afterburner::linear(%x, %weight, %bias)
  return (%y))");
  with_bias.runOnGraph(graph, has_constant_weight_and_bias);
  jit::SubgraphRewriter without_bias;
  without_bias.RegisterRewritePattern(R"(
graph(%x, %weight):
  %y = aten::matmul(%x, %weight)
  return (%y))",
                                      R"(
graph(%x, %weight):
  %y = afterburner::mm(%x, %weight)
  return (%y))");
  without_bias.runOnGraph(graph, has_constant_weight);
  return before - count_matmuls(graph);
}

}  // namespace afterburner::infer
