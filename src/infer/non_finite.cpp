#include "afterburner/infer/non_finite.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
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
const c10::Symbol kOnednnConvolution = c10::Symbol::fromQualString("prim::mkldnn_convolution");

// oneDNN's blocked layouts keep fp32 channels in blocks of 8 (AVX2) or 16 (AVX-512), the last
// block padded: a channel count that is a multiple of 16 has no padding in either.
constexpr int64_t kChannelBlock = 16;

// The ops on oneDNN tensors that give LibTorch's dense results for NaN and infinite inputs too,
// padded channels or not (tests/infer/non_finite_test.cpp checks each; oneDNN keeps padding
// channels 0, inf * 0 included, so a convolution after them reads zeros): oneDNN's arithmetic
// (convolution, sums and products, average pooling, norms, tanh, gelu, prelu). Not here, so
// moved to dense tensors: relu and max pooling (oneDNN takes max(x, 0) and a window's max
// with vmaxps, which returns the number when the other operand is NaN) and sigmoid.
bool propagates_like_aten(const jit::Node* node) {
  static const std::unordered_set<std::string> kinds{
      "aten::to_dense",      "prim::mkldnn_convolution",  "prim::BroadcastMKLDNNTensors",
      "aten::add",           "aten::add_",                "aten::mul",
      "aten::mul_",          "prim::MKLDNNScalarMul",     "prim::MKLDNNScalarMul_",
      "aten::avg_pool2d",    "aten::avg_pool3d",          "aten::adaptive_avg_pool2d",
      "aten::batch_norm",    "prim::MKLDNNLayerNorm",     "prim::MKLDNNLayerNorm_",
      "aten::tanh",          "aten::tanh_",               "aten::gelu",
      "aten::prelu",         "aten::dropout",             "aten::dropout_",
      // relu then max pooling, kernels of ours on oneDNN's own layouts, padding channels kept 0.
      "afterburner::relu_max_pool2d"};
  return kinds.count(node->kind().toQualString()) > 0;
}

// The ops optimize_for_inference runs as ATen's elementwise kernel over oneDNN's buffer, and that
// kernel as a dense op. LibTorch 1.13 hands the kernel the buffer with as many elements as the
// tensor has, not as the buffer holds: with padded channels it computes the first part of the
// buffer only, wrong for finite inputs too.
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

// A oneDNN convolution's weight [out, in / groups, ...], prepacked; undefined when the graph
// does not say.
at::Tensor convolution_weight(const jit::Node* convolution) {
  const jit::Node* weight = convolution->input(1)->node();
  return weight->kind() == kOnednnConstant ? weight->t(c10::attr::value) : at::Tensor();
}

bool fills_channel_blocks(int64_t channels) { return channels > 0 && channels % kChannelBlock == 0; }

// The values holding oneDNN tensors (what aten::to_mkldnn and oneDNN constants produce, and what
// any op but aten::to_dense computes from them: optimize_for_inference converts tensors only at
// the borders of the groups of ops it moves to oneDNN), and whether each may have padding
// channels: a convolution's output whose channels do not fill the blocks, and what ops compute
// from it (they keep its layout), but not what aten::to_mkldnn lays out (plainly).
class OnednnValues {
 public:
  bool holds(const jit::Value* value) const { return padded_.count(value) > 0; }

  bool read_by(const jit::Node* node) const {
    return std::any_of(node->inputs().begin(), node->inputs().end(), [this](const jit::Value* v) { return holds(v); });
  }

  bool may_be_padded(const jit::Value* value) const {
    const auto found = padded_.find(value);
    return found != padded_.end() && found->second;
  }

  void add(const jit::Value* value, bool padded) { padded_[value] = padded; }

  void add_outputs(const jit::Node* node) {
    bool padded;
    if (node->kind() == kToMkldnn || node->kind() == kOnednnConstant) {
      padded = false;
    } else if (node->kind() == kOnednnConvolution) {
      const at::Tensor weight = convolution_weight(node);
      padded = !weight.defined() || !fills_channel_blocks(weight.size(0));
    } else if (node->kind() != kToDense && read_by(node)) {
      padded = std::any_of(node->inputs().begin(), node->inputs().end(),
                           [this](const jit::Value* v) { return may_be_padded(v); });
    } else {
      return;
    }
    for (const jit::Value* output : node->outputs()) {
      if (is_tensor(output)) add(output, padded);
    }
  }

 private:
  std::unordered_map<const jit::Value*, bool> padded_;
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
    onednn.add(back->output(), false);
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

// An ATen-on-buffer op as its dense ATen op, with the bounds hardtanh and clamp keep as attributes.
jit::Node* as_aten(jit::Node* buffer_op) {
  std::vector<double> bounds;
  if (buffer_op->hasAttribute(c10::attr::min_val)) {
    bounds = {buffer_op->f(c10::attr::min_val), buffer_op->f(c10::attr::max_val)};
  }
  return replace_by(buffer_op, aten_of_buffer_op().at(buffer_op->kind().toQualString()), bounds);
}

// relu(x) as ATen's clamp(x, 0, inf) on oneDNN's buffer, where the relu was (in place or not):
// prim::MKLDNNHardTanh, which optimize_for_inference itself makes of hardtanh and relu6. NaN
// stays NaN and the tensor stays in oneDNN's layout, so the next convolution reorders nothing.
// Only for tensors without padding channels (see aten_of_buffer_op).
jit::Node* clamp_on_buffer(jit::Node* relu) {
  const char* kind = relu->kind() == c10::aten::relu_ ? "prim::MKLDNNHardTanh_" : "prim::MKLDNNHardTanh";
  jit::Node* clamp = relu->owningGraph()->create(c10::Symbol::fromQualString(kind), {relu->input(0)}, 1);
  clamp->f_(c10::attr::min_val, 0.0)->f_(c10::attr::max_val, std::numeric_limits<double>::infinity());
  clamp->insertBefore(relu);
  clamp->output()->copyMetadata(relu->output());
  relu->output()->replaceAllUsesWith(clamp->output());
  relu->destroy();
  return clamp;
}

bool is_relu(const jit::Node* node) { return node->kind() == c10::aten::relu || node->kind() == c10::aten::relu_; }

// Rewrites the ops of `block` (and of blocks inside it) that would drop NaN or infinities.
int rewrite_ops(jit::Block* block, OnednnValues& onednn) {
  int rewritten = 0;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    jit::Node* node = *it++;
    for (jit::Block* inner : node->blocks()) rewritten += rewrite_ops(inner, onednn);
    const bool padded = onednn.read_by(node) && onednn.may_be_padded(node->input(0));
    if (!onednn.read_by(node) || propagates_like_aten(node) || (is_buffer_op(node) && !padded)) {
      onednn.add_outputs(node);
      continue;
    }
    ++rewritten;
    if (is_relu(node) && !padded) {
      onednn.add_outputs(clamp_on_buffer(node));
    } else {
      run_on_aten(is_buffer_op(node) ? as_aten(node) : node, onednn);
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
