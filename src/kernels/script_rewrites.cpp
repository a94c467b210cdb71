#include "afterburner/kernels/script_rewrites.h"

#include <fmt/format.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>

#include <vector>

namespace afterburner::kernels {
namespace {

namespace jit = torch::jit;

// nn.MultiheadAttention.forward's arguments as LibTorch 1.13 scripts it: a forward of another
// signature (a traced one, a later PyTorch's) is left as it is.
const std::vector<std::string> kForwardArguments{"self",        "query",     "key", "value", "key_padding_mask",
                                                 "need_weights", "attn_mask", "average_attn_weights"};

// The native ops only the evaluation fast paths call: the fused encoder layer, and the nested
// tensor TransformerEncoder makes of a padded batch for it.
bool is_fast_path_op(const jit::Node* node) {
  static const c10::Symbol encoder_layer = c10::Symbol::fromQualString("aten::_transformer_encoder_layer_fwd");
  static const c10::Symbol nested = c10::Symbol::fromQualString("aten::_nested_tensor_from_mask");
  return node->kind() == encoder_layer || node->kind() == nested;
}

struct Resolver : jit::Resolver {
  std::shared_ptr<jit::SugaredValue> resolveValue(const std::string& name, jit::GraphFunction& function,
                                                  const jit::SourceRange& location) override {
    if (name == "afterburner") return std::make_shared<jit::BuiltinModule>("afterburner");
    return jit::nativeResolver()->resolveValue(name, function, location);
  }
};

}  // namespace

std::shared_ptr<jit::Resolver> resolver_with_afterburner_ops() { return std::make_shared<Resolver>(); }

bool is_torch_nn(const c10::ClassTypePtr& type, const char* name) {
  const auto qualified = type->name();
  return qualified && qualified->name() == name && qualified->prefix().rfind("__torch__.torch.nn.modules", 0) == 0;
}

std::string why_not_rewritable_attention(const c10::ClassTypePtr& type) {
  const jit::Function* forward = type->findMethod("forward");
  if (!forward) return "no forward (nothing calls it)";
  std::vector<std::string> arguments;
  for (const auto& argument : forward->getSchema().arguments()) arguments.push_back(argument.name());
  if (arguments != kForwardArguments) return "a forward of another signature (traced, or another PyTorch's)";
  auto holds = [&](const char* name, c10::TypeKind kind) {
    return type->hasAttribute(name) && type->getAttribute(name)->kind() == kind;
  };
  if (!holds("in_proj_weight", c10::TypeKind::TensorType)) return "separate query, key and value projections";
  const auto out_proj = type->hasAttribute("out_proj") ? type->getAttribute("out_proj")->cast<c10::ClassType>() : nullptr;
  if (!out_proj || !out_proj->hasAttribute("weight") || !out_proj->hasAttribute("bias")) return "an unusual out_proj";
  for (const char* name :
       {"training", "dropout", "add_zero_attn", "bias_k", "bias_v", "embed_dim", "num_heads", "in_proj_bias"}) {
    if (!type->hasAttribute(name)) return fmt::format("no attribute {}", name);
  }
  if (!type->hasConstant("batch_first") && !type->hasAttribute("batch_first")) return "no attribute batch_first";
  return "";
}

// Each fast path is `if <its conditions>: <the native op> ...`: that branch's condition made false,
// constant propagation keeps the other branch, and dead-code elimination drops what only the
// fast path read (the attention's packed weights).
int remove_transformer_fast_paths(const std::shared_ptr<jit::Graph>& graph) {
  std::shared_ptr<jit::Graph> mutable_graph = graph;  // as LibTorch's passes take it
  std::vector<jit::Node*> branches;
  jit::DepthFirstGraphNodeIterator nodes(mutable_graph);
  for (jit::Node* node = nodes.next(); node; node = nodes.next()) {
    if (!is_fast_path_op(node)) continue;
    // The outermost `if` whose true branch holds the op: the checks inside it read the packed
    // weights too (`if <conditions>: <more checks>; if <they pass>: <the op>`).
    jit::Node* branch = nullptr;
    for (jit::Block* block = node->owningBlock(); block->owningNode(); block = block->owningNode()->owningBlock()) {
      jit::Node* owner = block->owningNode();
      if (owner->kind() != c10::prim::If || owner->blocks().at(0) != block) break;
      branch = owner;
    }
    if (branch) branches.push_back(branch);
  }
  for (jit::Node* branch : branches) {
    jit::WithInsertPoint before(branch);
    branch->replaceInput(0, graph->insertConstant(false));
  }
  if (!branches.empty()) {
    jit::ConstantPropagation(mutable_graph);
    jit::EliminateDeadCode(mutable_graph);
  }
  return static_cast<int>(branches.size());
}

}  // namespace afterburner::kernels
