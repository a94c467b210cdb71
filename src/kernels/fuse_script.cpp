#include <fmt/format.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>

#include <string>
#include <unordered_map>

#include "afterburner/kernels/fuse.h"

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

// An in-place relu_ applied to a value nothing else reads is a relu; the conv2d overload taking
// padding as a string ("same") has no fused form.
bool fusable(const jit::Match& match, const Values& values) {
  if (values.count("padding") && !match.values_map.at(values.at("padding"))->type()->cast<c10::ListType>()) {
    return false;
  }
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

int count(const std::shared_ptr<jit::Graph>& graph, c10::Symbol kind) {
  int n = 0;
  jit::DepthFirstGraphNodeIterator nodes(const_cast<std::shared_ptr<jit::Graph>&>(graph));
  for (const jit::Node* node = nodes.next(); node; node = nodes.next()) n += node->kind() == kind;
  return n;
}

}  // namespace

ScriptFuseResult fuse_forward(const torch::jit::Module& module) {
  std::shared_ptr<jit::Graph> graph = module.get_method("forward").graph()->copy();
  jit::Inline(*graph);  // submodules' forwards become part of this graph, so patterns span them
  // Pooling first: a relu between a conv2d and a max_pool2d goes with the pooling, which applies
  // it to a quarter of the values.
  for (const Pattern* pattern : {&kReluMaxPool, &kConvRelu, &kLinearRelu}) {
    for (const char* relu : {"aten::relu", "aten::relu_"}) {
      jit::SubgraphRewriter rewriter;
      rewriter.RegisterRewritePattern(with_relu(pattern->pattern, relu), pattern->replacement);
      rewriter.runOnGraph(graph, fusable);
    }
  }
  ScriptFuseResult result;
  for (const auto& [op, what] : {std::pair<const char*, const char*>{"afterburner::relu_max_pool2d", "relu + max_pool2d"},
                                 {"afterburner::conv2d_relu", "conv2d + relu"},
                                 {"afterburner::linear_relu", "linear + relu"}}) {
    if (const int n = count(graph, c10::Symbol::fromQualString(op))) result.fused.push_back(fmt::format("{} x {}", n, what));
  }
  if (const int left = count(graph, c10::aten::relu) + count(graph, c10::aten::relu_)) {
    result.notices.push_back(fmt::format("{} relu(s) left unfused: not after a conv2d or linear nor before a "
                                         "max_pool2d, or their input has other uses",
                                         left));
  }
  result.forward = std::make_shared<jit::GraphFunction>("forward_fused", graph, nullptr);
  return result;
}

}  // namespace afterburner::kernels
