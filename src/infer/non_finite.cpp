#include "afterburner/infer/non_finite.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/kernels/fuse.h"

namespace afterburner::infer {
namespace {

namespace jit = torch::jit;

const c10::Symbol kToMkldnn = c10::Symbol::fromQualString("aten::to_mkldnn");
const c10::Symbol kToDense = c10::Symbol::fromQualString("aten::to_dense");
const c10::Symbol kOnednnConstant = c10::Symbol::fromQualString("prim::ConstantMKLDNNTensor");

// The ops on oneDNN tensors that give LibTorch's dense results for NaN and infinite inputs too,
// padded channels or not (tests/infer/non_finite_test.cpp checks each; oneDNN keeps padding
// channels 0, inf * 0 included, so a convolution after them reads zeros): oneDNN's arithmetic
// (convolution, sums and products, average pooling, norms, tanh, gelu, prelu), and ours. Not
// here: relu (oneDNN takes max(x, 0) with vmaxps, which returns the number when the other operand
// is NaN), which becomes hardtanh(x, 0, inf) on our kernel; max pooling (the same vmaxps) and
// sigmoid, moved to dense tensors.
bool propagates_like_aten(const jit::Node* node) {
  static const std::unordered_set<std::string> kinds{
      "aten::to_dense",      "prim::mkldnn_convolution",  "prim::BroadcastMKLDNNTensors",
      "aten::add",           "aten::add_",                "aten::mul",
      "aten::mul_",          "prim::MKLDNNScalarMul",     "prim::MKLDNNScalarMul_",
      "aten::avg_pool2d",    "aten::avg_pool3d",          "aten::adaptive_avg_pool2d",
      "aten::batch_norm",    "prim::MKLDNNLayerNorm",     "prim::MKLDNNLayerNorm_",
      "aten::tanh",          "aten::tanh_",               "aten::gelu",
      "aten::prelu",         "aten::dropout",             "aten::dropout_",
      // Kernels of ours on oneDNN's own layouts, padding channels kept 0 (kernels/relu_maxpool.cpp,
      // kernels/onednn_elementwise.cpp).
      "afterburner::relu_max_pool2d", "afterburner::broadcast_mul", "afterburner::conv2d_winograd",
      "afterburner::conv2d_activation", "aten::hardswish",
      "aten::hardswish_", "aten::hardsigmoid", "aten::hardsigmoid_", "aten::hardtanh", "aten::hardtanh_",
      "aten::clamp", "aten::clamp_", "aten::silu", "aten::silu_"};
  return kinds.count(node->kind().toQualString()) > 0;
}

// The ops optimize_for_inference runs as ATen's elementwise kernel over oneDNN's buffer, and that
// kernel as an ATen op, which our MkldnnCPU kernels run on the same buffer. LibTorch 1.13 hands the
// kernel the buffer with as many elements as the tensor has, not as the buffer holds: with padded
// channels it computes the first part of the buffer only, wrong for finite inputs too.
const std::map<std::string, std::string>& aten_of_buffer_op() {
  static const std::map<std::string, std::string> kinds{
      {"prim::MKLDNNHardTanh", "aten::hardtanh"},       {"prim::MKLDNNHardTanh_", "aten::hardtanh_"},
      {"prim::MKLDNNClamp", "aten::clamp"},             {"prim::MKLDNNClamp_", "aten::clamp_"},
      {"prim::MKLDNNHardSwish", "aten::hardswish"},     {"prim::MKLDNNHardSwish_", "aten::hardswish_"},
      {"prim::MKLDNNHardSigmoid", "aten::hardsigmoid"}, {"prim::MKLDNNHardSigmoid_", "aten::hardsigmoid_"}};
  return kinds;
}

bool is_buffer_op(const jit::Node* node) { return aten_of_buffer_op().count(node->kind().toQualString()) > 0; }

bool is_tensor(const jit::Value* value) { return value->type()->cast<c10::TensorType>() != nullptr; }

// The values holding oneDNN tensors: what aten::to_mkldnn and oneDNN constants produce, and what
// any op but aten::to_dense computes from them (optimize_for_inference converts tensors only at
// the borders of the groups of ops it moves to oneDNN).
class OnednnValues {
 public:
  bool holds(const jit::Value* value) const { return values_.count(value) > 0; }

  bool read_by(const jit::Node* node) const {
    return std::any_of(node->inputs().begin(), node->inputs().end(), [this](const jit::Value* v) { return holds(v); });
  }

  void add(const jit::Value* value) { values_.insert(value); }

  void add_outputs(const jit::Node* node) {
    const bool makes_onednn = node->kind() == kToMkldnn || node->kind() == kOnednnConstant;
    if (!makes_onednn && (node->kind() == kToDense || !read_by(node))) return;
    for (const jit::Value* output : node->outputs()) {
      if (is_tensor(output)) add(output);
    }
  }

 private:
  std::unordered_set<const jit::Value*> values_;
};

jit::Value* none_before(jit::Node* node) {
  jit::WithInsertPoint point(node);
  return node->owningGraph()->insertConstant(c10::IValue());
}

// `node` on dense tensors: its oneDNN inputs through aten::to_dense, its outputs back through
// aten::to_mkldnn for the ops after it. Two such ops in a row leave a round trip between them,
// which cancel_round_trips removes. An in-place op stays in place: optimize_for_inference made
// it so only where nothing reads its input after it.
void run_on_aten(jit::Node* node, OnednnValues& onednn) {
  if (node->kind().ns() != c10::namespaces::aten) {
    throw Error(fmt::format("prepare_for_inference: {} on oneDNN tensors has no dense form that keeps NaN as "
                            "LibTorch does",
                            node->kind().toQualString()));
  }
  jit::Graph& graph = *node->owningGraph();
  jit::Value* none = none_before(node);
  for (size_t i = 0; i < node->inputs().size(); ++i) {
    if (onednn.holds(node->input(i))) {
      node->replaceInput(i, graph.create(kToDense, {node->input(i), none})->insertBefore(node)->output());
    }
  }
  for (jit::Value* output : node->outputs()) {
    if (!is_tensor(output)) continue;
    jit::Node* back = graph.create(kToMkldnn, {output, none})->insertAfter(node);
    output->replaceAllUsesAfterNodeWith(back, back->output());
    onednn.add(back->output());
  }
}

// Replaces `node` by an op of `kind` on the same tensor (followed by `scalars`), in place of it.
jit::Node* replace_by(jit::Node* node, const std::string& kind, const std::vector<double>& scalars) {
  jit::WithInsertPoint point(node);
  std::vector<jit::NamedValue> arguments{node->input(0)};
  arguments.insert(arguments.end(), scalars.begin(), scalars.end());
  jit::Value* replacement = node->owningGraph()->insert(c10::Symbol::fromQualString(kind), arguments);
  replacement->copyMetadata(node->output());
  node->output()->replaceAllUsesWith(replacement);
  node->destroy();
  return replacement->node();
}

// An ATen-on-buffer op as its ATen op, with the bounds hardtanh and clamp keep as attributes.
jit::Node* as_aten(jit::Node* buffer_op) {
  std::vector<double> bounds;
  if (buffer_op->hasAttribute(c10::attr::min_val)) {
    bounds = {buffer_op->f(c10::attr::min_val), buffer_op->f(c10::attr::max_val)};
  }
  return replace_by(buffer_op, aten_of_buffer_op().at(buffer_op->kind().toQualString()), bounds);
}

// relu(x) as hardtanh(x, 0, inf) (in place or not, as the relu was), which keeps NaN, on the
// oneDNN tensor: the next convolution reorders nothing.
jit::Node* as_hardtanh(jit::Node* relu) {
  const char* kind = relu->kind() == c10::aten::relu_ ? "aten::hardtanh_" : "aten::hardtanh";
  return replace_by(relu, kind, {0.0, std::numeric_limits<double>::infinity()});
}

bool is_relu(const jit::Node* node) { return node->kind() == c10::aten::relu || node->kind() == c10::aten::relu_; }

// Rewrites the ops of `block` (and of blocks inside it) that would drop NaN or infinities.
int rewrite_ops(jit::Block* block, OnednnValues& onednn) {
  int rewritten = 0;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    jit::Node* node = *it++;
    for (jit::Block* inner : node->blocks()) rewritten += rewrite_ops(inner, onednn);
    if (!onednn.read_by(node) || propagates_like_aten(node)) {
      onednn.add_outputs(node);
      continue;
    }
    ++rewritten;
    if (is_relu(node)) {
      onednn.add_outputs(as_hardtanh(node));
    } else if (is_buffer_op(node)) {
      onednn.add_outputs(as_aten(node));
    } else {
      run_on_aten(node, onednn);
    }
  }
  return rewritten;
}

// to_dense(to_mkldnn(x)) is x.
void cancel_round_trips(jit::Block* block) {
  for (jit::Node* node : block->nodes()) {
    for (jit::Block* inner : node->blocks()) cancel_round_trips(inner);
    if (node->kind() == kToDense && node->input(0)->node()->kind() == kToMkldnn) {
      node->output()->replaceAllUsesWith(node->input(0)->node()->input(0));
    }
  }
}

}  // namespace

// A relu then max_pool2d becomes afterburner::relu_max_pool2d first, which pools oneDNN's buffer
// in place of oneDNN's pooling (ResNet-18 at batch 32: converting its stem's output to dense and
// back cost more than the pooling itself); a max_pool2d alone goes to dense tensors.
int propagate_non_finite_as_aten(std::shared_ptr<jit::Graph>& graph) {
  int rewritten = kernels::fuse_relu_max_pool2d(graph);
  OnednnValues onednn;
  rewritten += rewrite_ops(graph->block(), onednn);
  cancel_round_trips(graph->block());
  jit::EliminateDeadCode(graph);
  return rewritten;
}

}  // namespace afterburner::infer
