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

torch::Tensor linear_add_permuted(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                  const torch::Tensor& residual) {
  const torch::Tensor residual_rows = residual.permute({0, 2, 3, 1});
  const bool fp32 = x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
                    bias.scalar_type() == torch::kFloat && residual.scalar_type() == torch::kFloat;
  const bool channels_last_rows = x.dim() == 4 && residual.dim() == 4 && residual_rows.is_contiguous() &&
                                  residual_rows.sizes().slice(0, 3) == x.sizes().slice(0, 3) &&
                                  residual.size(1) == weight.size(1);
  if (!fp32 || !channels_last_rows) return at::add(residual, linear_on_onednn(x, weight, bias).permute({0, 3, 1, 2}));
  torch::Tensor sums = at::add(residual_rows, bias);  // contiguous as residual_rows: [N, H, W, C]
  torch::Tensor rows = sums.view({-1, weight.size(1)});
  kernels::mm_into(rows, x.reshape({-1, x.size(-1)}), weight, 1.0f);
  return sums.permute({0, 3, 1, 2});
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
  m.def("linear_add_permuted(Tensor x, Tensor weight, Tensor bias, Tensor residual) -> Tensor", linear_add_permuted);
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

namespace {

// The one node reading `value`, if exactly one does.
jit::Node* only_reader(const jit::Value* value) {
  return value->uses().size() == 1 ? value->uses()[0].user : nullptr;
}

bool constant_is(const jit::Value* value, const std::vector<int64_t>& list) {
  const auto constant = jit::toIValue(value);
  return constant && constant->isIntList() && constant->toIntVector() == list;
}

bool constant_is_one(const jit::Value* value) {
  const auto constant = jit::constant_as<int64_t>(value);
  return constant && *constant == 1;
}

// A constant fp32 tensor of `dim` dimensions.
c10::optional<torch::Tensor> constant_fp32(const jit::Value* value, int64_t dim) {
  const auto constant = jit::toIValue(value);
  if (!constant || !constant->isTensor()) return c10::nullopt;
  const torch::Tensor& tensor = constant->toTensor();
  if (tensor.scalar_type() != torch::kFloat || tensor.dim() != dim || !tensor.device().is_cpu()) return c10::nullopt;
  return tensor;
}

// scale * linear(x, weight, bias).permute(0, 3, 1, 2) + residual (either operand order of both),
// each intermediate read once, the weight, bias and scale ([C, 1, 1]) fp32 constants; else nullopt.
struct ScaledSum {
  jit::Node *permute, *mul, *add;
  torch::Tensor weight, bias, scale;
  size_t residual;  // the add's input: read when rewriting, as rewriting the sum before may replace it
};

c10::optional<ScaledSum> scaled_sum_of(jit::Node* linear) {
  ScaledSum sum;
  sum.permute = only_reader(linear->output());
  if (!sum.permute || sum.permute->kind() != c10::aten::permute || !constant_is(sum.permute->input(1), {0, 3, 1, 2})) {
    return c10::nullopt;
  }
  sum.mul = only_reader(sum.permute->output());
  sum.add = sum.mul && sum.mul->kind() == c10::aten::mul ? only_reader(sum.mul->output()) : nullptr;
  if (!sum.add || sum.add->kind() != c10::aten::add || !constant_is_one(sum.add->input(2))) return c10::nullopt;
  const auto weight = constant_fp32(linear->input(1), 2), bias = constant_fp32(linear->input(2), 1);
  const auto scale = constant_fp32(sum.mul->input(sum.mul->input(0) == sum.permute->output() ? 1 : 0), 3);
  if (!weight || !bias || !scale || bias->size(0) != weight->size(1) ||
      scale->sizes() != at::IntArrayRef{weight->size(1), 1, 1}) {
    return c10::nullopt;
  }
  sum.weight = *weight;
  sum.bias = *bias;
  sum.scale = scale->view({-1});
  sum.residual = sum.add->input(0) == sum.mul->output() ? 1 : 0;
  if (!sum.add->input(sum.residual)->type()->isSubtypeOf(*c10::TensorType::get())) return c10::nullopt;  // add.Scalar
  return sum;
}

}  // namespace

int add_scaled_linears_to_residuals(std::shared_ptr<jit::Graph>& graph) {
  const c10::Symbol linear = c10::Symbol::fromQualString("afterburner::linear");
  std::vector<std::pair<jit::Node*, ScaledSum>> found;
  for (jit::Node* node : graph->nodes()) {
    if (node->kind() != linear) continue;
    if (auto sum = scaled_sum_of(node)) found.emplace_back(node, *sum);
  }
  for (const auto& [node, sum] : found) {
    {
      const jit::WithInsertPoint point(sum.add);
      jit::Value* fused = graph->insert(c10::Symbol::fromQualString("afterburner::linear_add_permuted"),
                                        {node->input(0), graph->insertConstant(sum.weight * sum.scale.view({1, -1})),
                                         graph->insertConstant(sum.bias * sum.scale), sum.add->input(sum.residual)});
      sum.add->output()->replaceAllUsesWith(fused);
    }
    for (jit::Node* done : {sum.add, sum.mul, sum.permute, node}) done->destroy();
  }
  return static_cast<int>(found.size());
}

}  // namespace afterburner::infer
