#include <fmt/format.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/lower_tuples.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "afterburner/kernels/fuse.h"
#include "fuse_attention.h"

namespace afterburner::kernels {
namespace {

namespace jit = torch::jit;
using Values = std::unordered_map<std::string, jit::Value*>;

// `relu` is aten::relu or the in-place aten::relu_; the pattern is `producer` then that relu
// (or, for the pooling pattern, the relu then `producer`), rewritten to `fused`.
struct Pattern {
  std::string pattern;
  std::string replacement;
};

std::string with_relu(const std::string& text, const char* relu) {
  std::string out = text;
  for (size_t at = out.find("RELU"); at != std::string::npos; at = out.find("RELU", at)) out.replace(at, 4, relu);
  return out;
}

const Pattern kReluMaxPool{R"(
graph(%x, %kernel, %stride, %padding, %dilation, %ceil):
  %r = RELU(%x)
  %y = aten::max_pool2d(%r, %kernel, %stride, %padding, %dilation, %ceil)
  return (%y))",
                           R"(
graph(%x, %kernel, %stride, %padding, %dilation, %ceil):
  %y = afterburner::relu_max_pool2d(%x, %kernel, %stride, %padding, %dilation, %ceil)
  return (%y))"};

const Pattern kConvRelu{R"(
graph(%x, %weight, %bias, %stride, %padding, %dilation, %groups):
  %c = aten::conv2d(%x, %weight, %bias, %stride, %padding, %dilation, %groups)
  %y = RELU(%c)
  return (%y))",
                        R"(
graph(%x, %weight, %bias, %stride, %padding, %dilation, %groups):
  %y = afterburner::conv2d_relu(%x, %weight, %bias, %stride, %padding, %dilation, %groups)
  return (%y))"};

const Pattern kLinearRelu{R"(
graph(%x, %weight, %bias):
  %l = aten::linear(%x, %weight, %bias)
  %y = RELU(%l)
  return (%y))",
                          R"(
graph(%x, %weight, %bias):
  %y = afterburner::linear_relu(%x, %weight, %bias)
  return (%y))"};

// torch.jit.trace records every convolution as aten::_convolution: a 2-D one (4-D input, as the
// trace typed it) that is not transposed is conv2d.
const Pattern kTracedConvRelu{R"(
graph(%x, %weight, %bias, %stride, %padding, %dilation, %transposed, %output_padding, %groups, %benchmark,
      %deterministic, %cudnn, %tf32):
  %c = aten::_convolution(%x, %weight, %bias, %stride, %padding, %dilation, %transposed, %output_padding, %groups,
                          %benchmark, %deterministic, %cudnn, %tf32)
  %y = RELU(%c)
  return (%y))",
                              R"(
graph(%x, %weight, %bias, %stride, %padding, %dilation, %transposed, %output_padding, %groups, %benchmark,
      %deterministic, %cudnn, %tf32):
  %y = afterburner::conv2d_relu(%x, %weight, %bias, %stride, %padding, %dilation, %groups)
  return (%y))"};

// The other convolutions onto afterburner::conv2d, which trains depthwise ones and those of
// 1-pixel images its own way (kernels/conv2d.h) and the rest as aten::conv2d.
const Pattern kConv{R"(
graph(%input, %weight, %bias, %stride, %padding, %dilation, %groups):
  %y = aten::conv2d(%input, %weight, %bias, %stride, %padding, %dilation, %groups)
  return (%y))",
                           R"(
graph(%input, %weight, %bias, %stride, %padding, %dilation, %groups):
  %y = afterburner::conv2d(%input, %weight, %bias, %stride, %padding, %dilation, %groups)
  return (%y))"};

const Pattern kTracedConv{R"(
graph(%input, %weight, %bias, %stride, %padding, %dilation, %transposed, %output_padding, %groups, %benchmark,
      %deterministic, %cudnn, %tf32):
  %y = aten::_convolution(%input, %weight, %bias, %stride, %padding, %dilation, %transposed, %output_padding, %groups,
                          %benchmark, %deterministic, %cudnn, %tf32)
  return (%y))",
                                 R"(
graph(%input, %weight, %bias, %stride, %padding, %dilation, %transposed, %output_padding, %groups, %benchmark,
      %deterministic, %cudnn, %tf32):
  %y = afterburner::conv2d(%input, %weight, %bias, %stride, %padding, %dilation, %groups)
  return (%y))"};

bool traced_conv2d(const jit::Match& match, const Values& values) {
  const auto transposed = jit::toIValue(match.values_map.at(values.at("transposed")));
  const jit::Value* x = match.values_map.at(values.at(values.count("x") ? "x" : "input"));
  const auto input = x->type()->cast<c10::TensorType>();
  return transposed && transposed->isBool() && !transposed->toBool() && input && input->dim() == 4;
}

// An in-place relu_ applied to a value nothing else reads is a relu; the conv2d overload taking
// padding as a string ("same") has no fused form.
bool fusable(const jit::Match& match, const Values& values) {
  if (values.count("padding") && !match.values_map.at(values.at("padding"))->type()->cast<c10::ListType>()) {
    return false;
  }
  if (values.count("transposed") && !traced_conv2d(match, values)) return false;
  for (const char* relu_input : {"x", "c", "l"}) {
    auto found = values.find(relu_input);
    if (found == values.end()) continue;
    const jit::Value* value = match.values_map.at(found->second);
    for (const jit::Use& use : value->uses()) {
      if (use.user->kind() == c10::aten::relu_ && value->uses().size() > 1) return false;
    }
  }
  return true;
}

// `pattern` with either relu, where fusable (once for a pattern without relu).
void rewrite(std::shared_ptr<jit::Graph>& graph, const Pattern& pattern) {
  const bool has_relu = pattern.pattern.find("RELU") != std::string::npos;
  for (const char* relu : {"aten::relu", "aten::relu_"}) {
    if (!has_relu && relu != std::string("aten::relu")) break;
    jit::SubgraphRewriter rewriter;
    rewriter.RegisterRewritePattern(with_relu(pattern.pattern, relu), pattern.replacement);
    rewriter.runOnGraph(graph, fusable);
  }
}

// A residual sum and its activation, `relu(a + b)` or `silu(a + b)` (in place or not): the two
// terms computed tensors (not a scalar, which a trace records as a constant tensor), alpha the
// constant 1 and the sum read by the activation alone.
bool residual_sum(const jit::Match& match, const Values& values) {
  const auto alpha = jit::toIValue(match.values_map.at(values.at("alpha")));
  const bool unit =
      alpha && ((alpha->isInt() && alpha->toInt() == 1) || (alpha->isDouble() && alpha->toDouble() == 1.0));
  const auto computed_tensor = [&](const char* name) {
    const jit::Value* value = match.values_map.at(values.at(name));
    return value->type()->cast<c10::TensorType>() && value->node()->kind() != c10::prim::Constant;
  };
  return unit && computed_tensor("a") && computed_tensor("b") &&
         match.values_map.at(values.at("s"))->uses().size() == 1;
}

// Whether an op of the graph writes `value` in place (add_, relu_, copy_, ...).
bool written_in_place(const jit::Value* value) {
  for (const jit::Use& use : value->uses()) {
    const c10::FunctionSchema* schema = use.user->maybeSchema();
    if (schema == nullptr || use.offset >= schema->arguments().size()) continue;
    const c10::AliasInfo* alias = schema->arguments()[use.offset].alias_info();
    if (alias != nullptr && alias->isWrite()) return true;
  }
  return false;
}

// A SiLU's gradient is formed from the two terms, which the fused op keeps where eager's ops keep
// the sum: a term written in place later would fail autograd's check where eager's would not.
bool residual_sum_of_terms_kept(const jit::Match& match, const Values& values) {
  return residual_sum(match, values) && !written_in_place(match.values_map.at(values.at("a"))) &&
         !written_in_place(match.values_map.at(values.at("b")));
}

void fuse_add_activations(std::shared_ptr<jit::Graph>& graph) {
  for (const char* activation : {"relu", "silu"}) {
    for (const char* in_place : {"", "_"}) {
      jit::SubgraphRewriter rewriter;
      rewriter.RegisterRewritePattern(fmt::format(R"(
graph(%a, %b, %alpha):
  %s = aten::add(%a, %b, %alpha)
  %y = aten::{}{}(%s)
  return (%y))",
                                                  activation, in_place),
                                      fmt::format(R"(
graph(%a, %b, %alpha):
  %activation : str = prim::Constant[value="{}"]()
  %y = afterburner::add_activation(%a, %b, %activation)
  return (%y))",
                                                  activation));
      rewriter.runOnGraph(graph, activation == std::string("silu") ? residual_sum_of_terms_kept : residual_sum);
    }
  }
}

int count(const std::shared_ptr<jit::Graph>& graph, c10::Symbol kind) {
  int n = 0;
  jit::DepthFirstGraphNodeIterator nodes(const_cast<std::shared_ptr<jit::Graph>&>(graph));
  for (const jit::Node* node = nodes.next(); node; node = nodes.next()) n += node->kind() == kind;
  return n;
}

// The function a prim::CallMethod or prim::CallFunction node calls, if it has a graph.
jit::GraphFunction* callee(const jit::Node* node) {
  if (node->kind() == c10::prim::CallMethod) {
    const auto type = node->input(0)->type()->cast<c10::ClassType>();
    return type ? jit::tryToGraphFunction(type->getMethod(node->s(c10::attr::name))) : nullptr;
  }
  if (node->kind() == c10::prim::CallFunction) {
    const auto type = node->input(0)->type()->cast<c10::FunctionType>();
    return type ? jit::tryToGraphFunction(*type->function()) : nullptr;
  }
  return nullptr;
}

// Replaces each call in `block` by the callee's own graph; true if it replaced any.
bool inline_calls_once(jit::Block* block) {
  bool inlined = false;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    jit::Node* node = *it++;
    if (jit::GraphFunction* function = callee(node)) {
      if (node->kind() == c10::prim::CallFunction) node->removeInput(0);  // the function itself
      jit::inlineCallTo(node, function, function->graph().get());
      inlined = true;
    } else {
      for (jit::Block* inner : node->blocks()) inlined = inline_calls_once(inner) || inlined;
    }
  }
  return inlined;
}

// Dropout whose probability is a constant 0 (torchvision's ViT by default: nn.Dropout(0.0) keeps p
// a constant) as what LibTorch's op returns for it, its input. TorchScript's executor would run it
// through its differentiable lowering, which draws a mask of ones (bernoulli_) and multiplies by it
// whatever p is.
void remove_dropout_of_zero(jit::Block* block) {
  static const std::unordered_set<std::string> kinds{
      "aten::dropout",       "aten::dropout_",       "aten::feature_dropout",       "aten::feature_dropout_",
      "aten::alpha_dropout", "aten::alpha_dropout_", "aten::feature_alpha_dropout", "aten::feature_alpha_dropout_"};
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    jit::Node* node = *it++;
    for (jit::Block* inner : node->blocks()) remove_dropout_of_zero(inner);
    if (!kinds.count(node->kind().toQualString())) continue;
    const c10::optional<double> p = jit::constant_as<double>(node->input(1));
    if (!p || *p != 0.0) continue;
    node->output()->replaceAllUsesWith(node->input(0));
    node->destroy();
  }
}

// Every node of `kind` in `block` and its inner blocks for which `inputs_of` gives inputs (a
// node it gives none for stays), replaced by an `ours` node on them.
template <typename InputsOf>
void onto_ours(jit::Block* block, c10::Symbol kind, const char* ours, const InputsOf& inputs_of) {
  const c10::Symbol replacement_kind = c10::Symbol::fromQualString(ours);
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    jit::Node* node = *it++;
    for (jit::Block* inner : node->blocks()) onto_ours(inner, kind, ours, inputs_of);
    if (node->kind() != kind) continue;
    const c10::optional<std::vector<jit::Value*>> inputs = inputs_of(node);
    if (!inputs) continue;
    jit::Node* replacement = block->owningGraph()->create(replacement_kind, *inputs);
    replacement->insertBefore(node);
    replacement->output()->setType(node->output()->type());
    node->output()->replaceAllUsesWith(replacement->output());
    node->destroy();
  }
}

// aten::dropout, aten::gelu of the erf form and aten::layer_norm onto afterburner's ops:
// - dropout: every other one (those of p = 0 are gone), LibTorch's eager answer from the same
//   random draws, drawn in bulk (kernels/dropout.h); the executor's lowering of dropout (a mask of
//   ones multiplied in) is not applied to it;
// - gelu: where `approximate` is the constant "none" (kernels/gelu.h); the tanh form stays LibTorch's;
// - layer_norm: every one, its cases handed back to LibTorch where the kernel does not take them
//   (kernels/layer_norm.h); cudnn_enable, the last argument, means nothing on CPU; one read only by
//   Linear layers gives them bf16 under autocast (bf16_for_autocast).
void ops_onto_ours(std::shared_ptr<jit::Graph>& graph) {
  jit::Block* block = graph->block();
  using Inputs = c10::optional<std::vector<jit::Value*>>;
  onto_ours(block, c10::aten::dropout, "afterburner::dropout", [](jit::Node* node) -> Inputs {
    return node->inputs().vec();
  });
  onto_ours(block, c10::aten::gelu, "afterburner::gelu", [](jit::Node* node) -> Inputs {
    const auto approximate = node->inputs().size() == 2 ? jit::constant_as<std::string>(node->input(1)) : c10::nullopt;
    if (!approximate || *approximate != "none") return c10::nullopt;
    return std::vector<jit::Value*>{node->input(0)};
  });
  layer_norms_onto_ours(graph);
}

// The only node reading `value`, if exactly one does.
jit::Node* sole_reader(const jit::Value* value) {
  return value->uses().size() == 1 ? value->uses()[0].user : nullptr;
}

// Whether `value` is a graph input or made by a node before `node`.
bool defined_before(const jit::Value* value, const jit::Node* node) {
  return value->node()->kind() == c10::prim::Param || value->node()->isBefore(node);
}

// A sketched linear layer (afterburner::sklinear or sklinear_factored, whose last three arguments
// are relu, dropout and train) without an epilogue, followed by relu and/or afterburner::dropout
// that alone read its output: those become its epilogue (kernels/low_rank.h, the same bits), the
// two brought together so that the dropout's arguments are computed before the layer (where that
// keeps every read and write in order; otherwise the dropout stays).
// Returns how many layers took an epilogue.
int fuse_sketched_epilogues(const std::shared_ptr<jit::Graph>& graph, jit::Block* block) {
  static const std::unordered_set<std::string> kinds{"afterburner::sklinear", "afterburner::sklinear_factored"};
  int fused = 0;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    jit::Node* node = *it++;
    for (jit::Block* inner : node->blocks()) fused += fuse_sketched_epilogues(graph, inner);
    if (!kinds.count(node->kind().toQualString())) continue;
    const size_t relu_at = node->inputs().size() - 3, dropout_at = relu_at + 1, train_at = relu_at + 2;
    const c10::optional<bool> relu = jit::constant_as<bool>(node->input(relu_at));
    const c10::optional<double> p = jit::constant_as<double>(node->input(dropout_at));
    if (!relu || *relu || !p || *p != 0.0) continue;
    jit::Node* next = sole_reader(node->output());
    bool took = false;
    if (next && (next->kind() == c10::aten::relu || next->kind() == c10::aten::relu_)) {
      jit::WithInsertPoint insert_point(node);
      node->replaceInput(relu_at, graph->insertConstant(true));
      next->output()->replaceAllUsesWith(node->output());
      if (it != block->nodes().end() && *it == next) ++it;
      next->destroy();
      next = sole_reader(node->output());
      took = true;
    }
    // AliasDb moves the layer down to the dropout, or the dropout (and what it reads) up to the
    // layer, only where every read and write between keeps its order: an in-place update of the
    // layer's input in between must still come after the layer.
    if (next && next->kind().toQualString() == std::string("afterburner::dropout") && next->owningBlock() == block &&
        jit::AliasDb(graph).moveBeforeTopologicallyValid(node, next) && defined_before(next->input(1), node) &&
        defined_before(next->input(2), node)) {
      node->replaceInput(dropout_at, next->input(1));
      node->replaceInput(train_at, next->input(2));
      next->output()->replaceAllUsesWith(node->output());
      if (it != block->nodes().end() && *it == next) ++it;
      next->destroy();
      took = true;
    }
    fused += took;
  }
  return fused;
}

// Inlines `graph` (submodules' forwards become part of it, so patterns span them) and rewrites
// its fusable patterns in place, saying what it fused and what it left.
void fuse_graph(std::shared_ptr<jit::Graph>& graph, std::vector<std::string>& fused,
                std::vector<std::string>& notices) {
  // Not jit::Inline: it inlines each callee's optimized_graph(), which LibTorch caches at the
  // callee's first run and leaves un-inlined when that run had the executor's optimizations off
  // (train::Model's forward turns them off), so the patterns would not show. One level at a time:
  // attention's calls are rewritten where they show, before their body is inlined.
  AttentionRewrite attention;
  do {
    attention += rewrite_attention_calls(graph->block());
  } while (inline_calls_once(graph->block()));
  // Functional calls inline with their options' branches (F.relu's `if inplace:`, F.max_pool2d's
  // `if stride is None:`): folding those on the now constant options exposes the ops themselves.
  jit::ConstantPropagation(graph, /*ignore_custom_classes=*/true);
  remove_dropout_of_zero(graph->block());
  ops_onto_ours(graph);
  // An attention's weights that its caller drops (`out, _ = self.attention(x, x, x)`) are computed
  // by nothing once the tuple between them is gone.
  jit::LowerSimpleTuples(graph);
  jit::EliminateDeadCode(graph);
  // Pooling first: a relu between a conv2d and a max_pool2d goes with the pooling, which applies
  // it to a quarter of the values.
  for (const Pattern* pattern :
       {&kReluMaxPool, &kConvRelu, &kTracedConvRelu, &kLinearRelu, &kConv, &kTracedConv}) {
    rewrite(graph, *pattern);
  }
  fuse_add_activations(graph);
  if (const int n = fuse_sketched_epilogues(graph, graph->block())) {
    fused.push_back(fmt::format("{} x sketched linear + relu/dropout", n));
  }
  if (attention.fused) fused.push_back(fmt::format("{} x multi-head attention", attention.fused));
  notices.insert(notices.end(), attention.notices.begin(), attention.notices.end());
  using Kind = std::pair<const char*, const char*>;
  for (const auto& [op, what] : {Kind{"afterburner::relu_max_pool2d", "relu + max_pool2d"},
                                 Kind{"afterburner::conv2d_relu", "conv2d + relu"},
                                 Kind{"afterburner::linear_relu", "linear + relu"},
                                 Kind{"afterburner::add_activation", "add + activation"},
                                 Kind{"afterburner::conv2d", "conv2d"},
                                 Kind{"afterburner::dropout", "dropout"},
                                 Kind{"afterburner::gelu", "gelu"},
                                 Kind{"afterburner::layer_norm", "layer_norm"}}) {
    if (const int n = count(graph, c10::Symbol::fromQualString(op))) fused.push_back(fmt::format("{} x {}", n, what));
  }
  if (const int left = count(graph, c10::aten::relu) + count(graph, c10::aten::relu_)) {
    notices.push_back(fmt::format("{} relu(s) left unfused: not after a conv2d, linear or add nor before a "
                                  "max_pool2d, or their input has other uses",
                                  left));
  }
}

}  // namespace

int layer_norms_onto_ours(std::shared_ptr<torch::jit::Graph>& graph) {
  const int before = count(graph, c10::aten::layer_norm);
  onto_ours(graph->block(), c10::aten::layer_norm, "afterburner::layer_norm",
            [&](jit::Node* node) -> c10::optional<std::vector<jit::Value*>> {
              if (node->inputs().size() != 6) return c10::nullopt;
              // Read only as the input of Linear layers: under bf16 autocast they cast it to bf16.
              const auto& uses = node->output()->uses();
              const bool only_linears = !uses.empty() && std::all_of(uses.begin(), uses.end(), [](const jit::Use& use) {
                return use.user->kind() == c10::aten::linear && use.offset == 0;
              });
              jit::WithInsertPoint insert_point(node);
              std::vector<jit::Value*> inputs = node->inputs().slice(0, 5).vec();
              inputs.push_back(graph->insertConstant(only_linears));
              return inputs;
            });
  return before - count(graph, c10::aten::layer_norm);
}

void inline_calls(torch::jit::Graph& graph) {
  // Callees' own graphs hold calls in turn: inline until none is left.
  while (inline_calls_once(graph.block())) {
  }
}

int fuse_relu_max_pool2d(std::shared_ptr<torch::jit::Graph>& graph) {
  const c10::Symbol fused = c10::Symbol::fromQualString("afterburner::relu_max_pool2d");
  const int before = count(graph, fused);
  rewrite(graph, kReluMaxPool);
  return count(graph, fused) - before;
}

ScriptFuseResult fuse_forward(const torch::jit::Module& module) {
  std::shared_ptr<jit::Graph> graph = module.get_method("forward").graph()->copy();
  ScriptFuseResult result;
  fuse_graph(graph, result.fused, result.notices);
  result.forward = std::make_shared<jit::GraphFunction>("forward_fused", graph, nullptr);
  return result;
}

FusedScript fuse_script(const torch::jit::Module& module) {
  // clone(inplace) gives the copy types of its own, so rewriting its forward leaves `module` and
  // any module sharing its type as they were, and shares every parameter and buffer tensor.
  FusedScript result{module.clone(/*inplace=*/true), {}, {}};
  std::shared_ptr<jit::Graph> graph = result.module.get_method("forward").graph();  // the copy's own
  fuse_graph(graph, result.fused, result.notices);
  return result;
}

}  // namespace afterburner::kernels
