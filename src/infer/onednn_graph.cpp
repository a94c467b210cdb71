#include "afterburner/infer/onednn_graph.h"

#include <fmt/format.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>

#include <string>
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

int run_silu_on_onednn(std::shared_ptr<torch::jit::Graph>& graph) {
  const c10::Symbol to_dense = c10::Symbol::fromQualString("aten::to_dense");
  const c10::Symbol to_mkldnn = c10::Symbol::fromQualString("aten::to_mkldnn");
  int moved = 0;
  for (auto it = graph->nodes().begin(); it != graph->nodes().end();) {
    torch::jit::Node* silu = *it++;
    if (silu->kind() != c10::aten::silu && silu->kind() != c10::aten::silu_) continue;
    torch::jit::Node* dense = silu->input(0)->node();
    if (dense->kind() != to_dense) continue;
    torch::jit::WithInsertPoint point(silu);
    torch::jit::Value* on_onednn = graph->insert(c10::aten::silu, {dense->input(0)});
    torch::jit::Value* result = on_onednn;
    const auto& uses = silu->output()->uses();
    // A single reader converting back takes the oneDNN result itself, which nothing else reads.
    const bool only_converted_back = uses.size() == 1 && uses[0].user->kind() == to_mkldnn;
    if (only_converted_back) {
      uses[0].user->output()->replaceAllUsesWith(on_onednn);
    } else {
      result = graph->insert(to_dense, {on_onednn, graph->insertConstant(c10::IValue())});
    }
    silu->output()->replaceAllUsesWith(result);
    silu->destroy();
    ++moved;
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
