#include "afterburner/infer/onednn_graph.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

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

}  // namespace afterburner::infer
