#include "afterburner/infer/onednn_graph.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graph_edits.h"

namespace afterburner::infer {

int multiply_broadcasts_on_onednn(std::shared_ptr<torch::jit::Graph>& graph) {
  const c10::Symbol fused = c10::Symbol::fromQualString("afterburner::broadcast_mul");
  const auto count = [&] {
    int n = 0;
    for (const torch::jit::Node* node : graph->nodes()) n += node->kind() == fused;
    return n;
  };
  const int before = count();
  // The in-place product writes into one of the expanded copies, which nothing else reads; the
  // product is the same in either order (one rounding of the exact product).
  for (const char* mul : {"aten::mul", "aten::mul_"}) {
    for (const char* operands : {"%x, %y", "%y, %x"}) {
      torch::jit::SubgraphRewriter rewriter;
      rewriter.RegisterRewritePattern(fmt::format(R"(
graph(%a, %b):
  %x : Tensor, %y : Tensor = prim::BroadcastMKLDNNTensors(%a, %b)
  %z = {}({})
  return (%z))",
                                                  mul, operands),
                                      R"(
graph(%a, %b):
  %z = afterburner::broadcast_mul(%a, %b)
  return (%z))");
      rewriter.runOnGraph(graph);
    }
  }
  return count() - before;
}

namespace {

// The ops that give LibTorch's answers on oneDNN tensors too, each as the out-of-place kind it
// runs as there: silu on our MkldnnCPU kernel; oneDNN's average pooling to 1x1 (other output sizes
// must divide the input's on oneDNN).
std::optional<c10::Symbol> onednn_form(const torch::jit::Node* node) {
  if (node->kind() == c10::aten::silu || node->kind() == c10::aten::silu_) return c10::aten::silu;
  if (node->kind() == c10::aten::adaptive_avg_pool2d) {
    const auto size = torch::jit::toIValue(node->input(1));
    if (size && size->isIntList() && size->toIntVector() == std::vector<int64_t>{1, 1}) return node->kind();
  }
  return std::nullopt;
}

// A conversion to or from oneDNN's layout that keeps the dtype (its second argument None).
bool no_dtype(const torch::jit::Node* conversion) {
  const auto dtype = torch::jit::toIValue(conversion->input(1));
  return dtype && dtype->isNone();
}

// Whether an op writes into `value`: an in-place op's first argument (ATen's trailing underscore,
// LibTorch's prim::MKLDNN..._ ops too), or what prim::BroadcastMKLDNNTensors hands on of it (the
// tensor itself where the sizes agree).
bool written_in_place(const torch::jit::Value* value) {
  static const c10::Symbol broadcast = c10::Symbol::fromQualString("prim::BroadcastMKLDNNTensors");
  for (const torch::jit::Use& use : value->uses()) {
    if (use.user->kind() == broadcast) {
      if (written_in_place(use.user->output(use.offset))) return true;
      continue;
    }
    const std::string name = use.user->kind().toUnqualString();
    if (use.offset == 0 && name.back() == '_') return true;
  }
  return false;
}

// to_mkldnn(to_dense(x)) of a oneDNN tensor x is x again, less two passes over it: where
// optimize_for_inference's subgraphs end between a tensor and a later reader (a residual sum after
// a block whose activations it computes densely: EfficientNet's and MobileNetV3's), it converts the
// tensor to dense and back. Neither copy may be written in place for them to be one tensor.
int skip_round_trips(torch::jit::Graph& graph) {
  const c10::Symbol to_dense = c10::Symbol::fromQualString("aten::to_dense");
  const c10::Symbol to_mkldnn = c10::Symbol::fromQualString("aten::to_mkldnn");
  int skipped = 0;
  for (torch::jit::Node* node : graph.nodes()) {
    if (node->kind() != to_mkldnn) continue;
    const torch::jit::Node* dense = node->input(0)->node();
    if (dense->kind() != to_dense || !no_dtype(node) || !no_dtype(dense)) continue;
    torch::jit::Value* original = dense->input(0);
    if (written_in_place(original) || written_in_place(node->output())) continue;
    node->output()->replaceAllUsesWith(original);
    ++skipped;
  }
  return skipped;
}

}  // namespace

int move_onto_onednn(std::shared_ptr<torch::jit::Graph>& graph) {
  const c10::Symbol to_dense = c10::Symbol::fromQualString("aten::to_dense");
  const c10::Symbol to_mkldnn = c10::Symbol::fromQualString("aten::to_mkldnn");
  int moved = 0;
  for (auto it = graph->nodes().begin(); it != graph->nodes().end();) {
    torch::jit::Node* node = *it++;
    const auto form = onednn_form(node);
    if (!form || node->input(0)->node()->kind() != to_dense) continue;
    torch::jit::Node* dense = node->input(0)->node();
    // An in-place op changed the dense copy for anything reading it after: only a copy read by
    // nothing else moves.
    if (node->kind() == c10::aten::silu_ && dense->output()->uses().size() != 1) continue;
    torch::jit::WithInsertPoint point(node);
    std::vector<torch::jit::NamedValue> inputs{dense->input(0)};
    for (size_t i = 1; i < node->inputs().size(); ++i) inputs.emplace_back(node->input(i));
    torch::jit::Value* on_onednn = graph->insert(*form, inputs);
    torch::jit::Value* result = on_onednn;
    const auto& uses = node->output()->uses();
    // A single reader converting back takes the oneDNN result itself, which nothing else reads.
    if (uses.size() == 1 && uses[0].user->kind() == to_mkldnn) {
      uses[0].user->output()->replaceAllUsesWith(on_onednn);
    } else {
      result = graph->insert(to_dense, {on_onednn, graph->insertConstant(c10::IValue())});
    }
    node->output()->replaceAllUsesWith(result);
    node->destroy();
    ++moved;
  }
  // The moves convert their results for every reader that is not oneDNN's, size reads too. Then
  // what is left, a dense product converted back, x densely times a dense scale, is the product
  // on oneDNN's layout.
  read_sizes_on_onednn(graph);
  for (const char* operands : {"%s, %d", "%d, %s"}) {
    torch::jit::SubgraphRewriter rewriter;
    rewriter.RegisterRewritePattern(fmt::format(R"(
graph(%s, %y, %none, %dtype):
  %d = aten::to_dense(%y, %none)
  %m = aten::mul({})
  %r = aten::to_mkldnn(%m, %dtype)
  return (%r))",
                                                operands),
                                    R"(
graph(%s, %y, %none, %dtype):
  %r = afterburner::broadcast_mul(%s, %y)
  return (%r))");
    // A conversion to another dtype is not the product's.
    rewriter.runOnGraph(graph, [](const torch::jit::Match& match,
                                  const std::unordered_map<std::string, torch::jit::Value*>& pattern) {
      const auto dtype = torch::jit::toIValue(match.values_map.at(pattern.at("dtype")));
      return dtype && dtype->isNone();
    });
  }
  moved += skip_round_trips(*graph);
  torch::jit::EliminateDeadCode(graph);
  return moved;
}

int read_sizes_on_onednn(std::shared_ptr<torch::jit::Graph>& graph) {
  const c10::Symbol to_dense = c10::Symbol::fromQualString("aten::to_dense");
  int rewritten = 0;
  for (torch::jit::Node* node : graph->nodes()) {
    if (node->kind() != to_dense) continue;
    const std::vector<torch::jit::Use> uses = node->output()->uses();  // replaceInput edits the list
    for (const torch::jit::Use& use : uses) {
      if (use.user->kind() == c10::aten::size || use.user->kind() == c10::aten::dim) {
        use.user->replaceInput(use.offset, node->input(0));
        ++rewritten;
      }
    }
  }
  torch::jit::EliminateDeadCode(graph);
  return rewritten;
}

namespace {

// An inference BatchNorm's per-channel factor and term, float as LibTorch's batch_norm computes
// them: y = x * scale + shift, scale = weight / sqrt(var + eps), shift = bias - mean * scale.
std::optional<std::pair<at::Tensor, at::Tensor>> batch_norm_terms(const torch::jit::Node* norm) {
  const auto tensor = [&](size_t i) { return torch::jit::toIValue(norm->input(i)); };
  const auto training = torch::jit::constant_as<bool>(norm->input(5));
  const auto eps = torch::jit::constant_as<double>(norm->input(7));
  const auto mean = tensor(3), var = tensor(4), weight = tensor(1), bias = tensor(2);
  const auto float_vector = [](const c10::optional<c10::IValue>& v) {
    return v && v->isTensor() && v->toTensor().dim() == 1 && v->toTensor().scalar_type() == at::kFloat &&
           !v->toTensor().is_mkldnn();
  };
  const auto optional_vector = [&](const c10::optional<c10::IValue>& v) { return v && (v->isNone() || float_vector(v)); };
  if (!training || *training || !eps || !float_vector(mean) || !float_vector(var) || !optional_vector(weight) ||
      !optional_vector(bias)) {
    return std::nullopt;
  }
  const int64_t channels = mean->toTensor().size(0);
  at::Tensor scale = at::empty({channels}, at::kFloat), shift = at::empty({channels}, at::kFloat);
  const at::Tensor m = mean->toTensor().contiguous(), v = var->toTensor().contiguous();
  const at::Tensor w = weight->isNone() ? at::ones({channels}) : weight->toTensor().contiguous();
  const at::Tensor b = bias->isNone() ? at::zeros({channels}) : bias->toTensor().contiguous();
  if (v.size(0) != channels || w.size(0) != channels || b.size(0) != channels) return std::nullopt;
  for (int64_t c = 0; c < channels; ++c) {
    const float invstd = 1 / std::sqrt(v.data_ptr<float>()[c] + static_cast<float>(*eps));
    scale.data_ptr<float>()[c] = invstd * w.data_ptr<float>()[c];
    shift.data_ptr<float>()[c] = b.data_ptr<float>()[c] - m.data_ptr<float>()[c] * scale.data_ptr<float>()[c];
  }
  return std::make_pair(scale, shift);
}

}  // namespace

int batch_norm_relu_into_onednn(std::shared_ptr<torch::jit::Graph>& graph) {
  const c10::Symbol to_mkldnn = c10::Symbol::fromQualString("aten::to_mkldnn");
  std::vector<torch::jit::Node*> conversions;
  for (torch::jit::Node* node : graph->nodes()) {
    if (node->kind() != to_mkldnn || !torch::jit::toIValue(node->input(1)) ||
        !torch::jit::toIValue(node->input(1))->isNone()) {
      continue;
    }
    const torch::jit::Node* relu = node->input(0)->node();
    if ((relu->kind() != c10::aten::relu && relu->kind() != c10::aten::relu_) || relu->output()->uses().size() != 1) {
      continue;
    }
    const torch::jit::Node* norm = relu->input(0)->node();
    if (norm->kind() == c10::aten::batch_norm && norm->output()->uses().size() == 1) conversions.push_back(node);
  }
  int rewritten = 0;
  for (torch::jit::Node* conversion : conversions) {
    torch::jit::Node* relu = conversion->input(0)->node();
    torch::jit::Node* norm = relu->input(0)->node();
    const auto terms = batch_norm_terms(norm);
    if (!terms) continue;
    torch::jit::Value* x = norm->input(0);
    torch::jit::Value *scale = nullptr, *shift = nullptr;
    {
      const torch::jit::WithInsertPoint point(conversion);
      scale = graph->insertConstant(terms->first);
      shift = graph->insertConstant(terms->second);
    }
    replace_by_bounded_call(conversion, "afterburner::scale_shift_relu_to_onednn", {x, scale, shift});
    relu->destroy();
    norm->destroy();
    ++rewritten;
  }
  return rewritten;
}

namespace {

// A oneDNN constant's dense tensor (a prepacked convolution weight comes back as [out, in/groups,
// kh, kw]); nullopt for anything else.
std::optional<at::Tensor> dense_constant(const torch::jit::Value* value) {
  const torch::jit::Node* constant = value->node();
  if (constant->kind() != c10::Symbol::fromQualString("prim::ConstantMKLDNNTensor")) return std::nullopt;
  return constant->t(c10::attr::value).to_dense();
}

// A oneDNN convolution aten::conv2d computes from dense copies of its constants: an fp32 4-D
// weight, a bias or none.
bool convolves_densely(const torch::jit::Node* conv) {
  const auto weight = dense_constant(conv->input(1));
  const auto bias = torch::jit::toIValue(conv->input(2));
  return weight && weight->dim() == 4 && weight->scalar_type() == at::kFloat &&
         ((bias && bias->isNone()) || dense_constant(conv->input(2))) && constant_int_pair(conv->input(3)) &&
         constant_int_pair(conv->input(4)) && constant_int_pair(conv->input(5)) &&
         torch::jit::constant_as<int64_t>(conv->input(6));
}

// The convolutions a to_mkldnn conversion feeds, directly or through one another, in the graph's
// order, and the conversions of their results to dense; nullopt where anything else reads them or
// a dense result is written in place (one tensor will stand for all conversions of a result).
struct ConvolutionChain {
  std::vector<torch::jit::Node*> convolutions;
  std::vector<torch::jit::Node*> conversions;
};

std::optional<ConvolutionChain> convolution_chain(torch::jit::Node* to_mkldnn) {
  const c10::Symbol conv = c10::Symbol::fromQualString("prim::mkldnn_convolution");
  const c10::Symbol to_dense = c10::Symbol::fromQualString("aten::to_dense");
  ConvolutionChain chain;
  std::vector<torch::jit::Value*> pending{to_mkldnn->output()};
  while (!pending.empty()) {
    const torch::jit::Value* value = pending.back();
    pending.pop_back();
    for (const torch::jit::Use& use : value->uses()) {
      if (use.user->kind() == conv && use.offset == 0 && convolves_densely(use.user)) {
        chain.convolutions.push_back(use.user);
        pending.push_back(use.user->output());
      } else if (use.user->kind() == to_dense && value != to_mkldnn->output() && no_dtype(use.user) &&
                 !written_in_place(use.user->output())) {
        chain.conversions.push_back(use.user);
      } else {
        return std::nullopt;
      }
    }
  }
  std::sort(chain.convolutions.begin(), chain.convolutions.end(),
            [](const torch::jit::Node* a, const torch::jit::Node* b) { return a->isBefore(b); });
  return chain;
}

// Whether x.permute(0, 2, 3, 1) reads `value`: the reader wants channels-last.
bool permuted_to_channels_last(const torch::jit::Value* value) {
  return std::any_of(value->uses().begin(), value->uses().end(), [](const torch::jit::Use& use) {
    const auto dims = use.user->kind() == c10::aten::permute ? torch::jit::toIValue(use.user->input(1)) : c10::nullopt;
    return dims && dims->isIntList() && dims->toIntVector() == std::vector<int64_t>{0, 2, 3, 1};
  });
}

// Rewrites the chain's convolutions as aten::conv2d of dense tensors, the conversions gone.
void convolve_densely(torch::jit::Graph& graph, torch::jit::Node* to_mkldnn, const ConvolutionChain& chain) {
  std::unordered_map<const torch::jit::Value*, torch::jit::Value*> dense{{to_mkldnn->output(), to_mkldnn->input(0)}};
  for (torch::jit::Node* conv : chain.convolutions) {
    const torch::jit::WithInsertPoint point(conv);
    const auto bias = dense_constant(conv->input(2));
    torch::jit::Value* y = graph.insert(
        c10::aten::conv2d, {dense.at(conv->input(0)), graph.insertConstant(*dense_constant(conv->input(1))),
                            bias ? graph.insertConstant(*bias) : graph.insertConstant(c10::IValue()), conv->input(3),
                            conv->input(4), conv->input(5), conv->input(6)});
    dense[conv->output()] = y;
  }
  for (torch::jit::Node* conversion : chain.conversions) {
    conversion->output()->replaceAllUsesWith(dense.at(conversion->input(0)));
    conversion->destroy();
  }
  for (auto conv = chain.convolutions.rbegin(); conv != chain.convolutions.rend(); ++conv) (*conv)->destroy();
  to_mkldnn->destroy();
}

}  // namespace

int convolve_channels_last_densely(std::shared_ptr<torch::jit::Graph>& graph) {
  const c10::Symbol to_mkldnn = c10::Symbol::fromQualString("aten::to_mkldnn");
  std::vector<std::pair<torch::jit::Node*, ConvolutionChain>> chains;
  for (torch::jit::Node* node : graph->nodes()) {
    if (node->kind() != to_mkldnn || !no_dtype(node) || written_in_place(node->input(0))) continue;
    auto chain = convolution_chain(node);
    if (chain && std::any_of(chain->conversions.begin(), chain->conversions.end(),
                             [](const torch::jit::Node* c) { return permuted_to_channels_last(c->output()); })) {
      chains.emplace_back(node, std::move(*chain));
    }
  }
  int rewritten = 0;
  for (const auto& [conversion, chain] : chains) {
    convolve_densely(*graph, conversion, chain);
    rewritten += static_cast<int>(chain.convolutions.size());
  }
  torch::jit::EliminateDeadCode(graph);
  return rewritten;
}

}  // namespace afterburner::infer
