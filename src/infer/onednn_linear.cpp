#include "afterburner/infer/onednn_linear.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>
#include <torch/library.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "afterburner/kernels/gemm.h"

namespace afterburner::infer {
namespace {

namespace jit = torch::jit;

// x [..., K] times weight [K, N] (+ bias [N] when defined), x's leading dimensions kept, as
// aten::matmul does with a matrix on the right.
torch::Tensor rows_times(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const torch::Tensor rows = x.reshape({-1, x.size(-1)});
  const torch::Tensor y = bias.defined() ? kernels::addmm(bias, rows, weight) : kernels::mm(rows, weight);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(1);
  return y.view(sizes);
}

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.def("linear(Tensor x, Tensor weight, Tensor bias) -> Tensor", rows_times);
  m.def("mm(Tensor x, Tensor weight) -> Tensor",
        [](const torch::Tensor& x, const torch::Tensor& weight) { return rows_times(x, weight, {}); });
}

using Values = std::unordered_map<std::string, jit::Value*>;

c10::optional<torch::Tensor> constant_fp32(const jit::Match& match, const Values& values, const char* name,
                                           int64_t dim) {
  auto constant = jit::toIValue(match.values_map.at(values.at(name)));
  if (!constant || !constant->isTensor()) return c10::nullopt;
  torch::Tensor tensor = constant->toTensor();
  if (tensor.dim() != dim || tensor.scalar_type() != torch::kFloat || !tensor.device().is_cpu()) return c10::nullopt;
  return tensor;
}

bool has_constant_weight(const jit::Match& match, const Values& values) {
  return constant_fp32(match, values, "weight", 2).has_value();
}

// The weight as above, the bias a constant vector of the weight's width, alpha 1.
bool has_constant_weight_and_bias(const jit::Match& match, const Values& values) {
  const auto weight = constant_fp32(match, values, "weight", 2);
  const auto bias = constant_fp32(match, values, "bias", 1);
  const auto alpha = jit::toIValue(match.values_map.at(values.at("alpha")));
  return weight && bias && bias->size(0) == weight->size(1) && alpha && alpha->isInt() && alpha->toInt() == 1;
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
