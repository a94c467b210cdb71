#include "afterburner/infer/attention_fast_paths.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "afterburner/infer/onednn_linear.h"
#include "afterburner/kernels/attention.h"
#include "afterburner/kernels/layer_norm.h"
#include "graph_edits.h"

namespace afterburner::infer {
namespace {

namespace jit = torch::jit;

bool all_strided_cpu_of(std::initializer_list<const torch::Tensor*> tensors, at::ScalarType dtype) {
  for (const torch::Tensor* t : tensors) {
    if (!t->defined() || t->is_nested() || t->layout() != torch::kStrided || !t->device().is_cpu() ||
        t->scalar_type() != dtype) {
      return false;
    }
  }
  return true;
}

// The inputs self_attention computes itself: everything else goes to the native op.
bool computed_here(const torch::Tensor& x, int64_t embed_dim, int64_t num_heads, const AttentionWeights& w) {
  const at::ScalarType dtype = x.scalar_type();
  if (dtype != torch::kFloat && dtype != torch::kBFloat16) return false;
  if (!all_strided_cpu_of({&x, &w.qkv_weight, &w.qkv_bias, &w.proj_weight, &w.proj_bias}, dtype)) return false;
  const int64_t e = embed_dim;
  return x.dim() == 3 && x.numel() > 0 && x.size(2) == e && num_heads > 0 && e % num_heads == 0 &&
         w.qkv_weight.sizes() == torch::IntArrayRef{3 * e, e} && w.qkv_bias.sizes() == torch::IntArrayRef{3 * e} &&
         w.proj_weight.sizes() == torch::IntArrayRef{e, e} && w.proj_bias.sizes() == torch::IntArrayRef{e};
}

// The same for encoder_layer: its LayerNorms' and feed-forward block's weights too.
bool computed_here(const torch::Tensor& src, int64_t embed_dim, int64_t num_heads, const AttentionWeights& attention,
                   const EncoderLayerWeights& w) {
  if (!computed_here(src, embed_dim, num_heads, attention)) return false;
  if (!all_strided_cpu_of({&w.norm1_weight, &w.norm1_bias, &w.norm2_weight, &w.norm2_bias, &w.linear1_weight,
                           &w.linear1_bias, &w.linear2_weight, &w.linear2_bias},
                          src.scalar_type())) {
    return false;
  }
  const int64_t e = embed_dim, hidden = w.linear1_weight.size(0);
  const std::array<int64_t, 1> per_feature{e};
  return w.norm1_weight.sizes() == per_feature && w.norm1_bias.sizes() == per_feature &&
         w.norm2_weight.sizes() == per_feature && w.norm2_bias.sizes() == per_feature &&
         w.linear1_weight.sizes() == torch::IntArrayRef{hidden, e} &&
         w.linear1_bias.sizes() == torch::IntArrayRef{hidden} &&
         w.linear2_weight.sizes() == torch::IntArrayRef{e, hidden} && w.linear2_bias.sizes() == per_feature;
}

torch::Tensor feed_forward(const torch::Tensor& x, const EncoderLayerWeights& w) {
  const torch::Tensor hidden = linear_on_onednn(x, w.linear1_weight.t(), w.linear1_bias,
                                                w.use_gelu ? kernels::Epilogue::gelu : kernels::Epilogue::relu);
  return linear_on_onednn(hidden, w.linear2_weight.t(), w.linear2_bias);
}

// ---- The graph rewrite ----

const c10::Symbol kNativeAttention = c10::Symbol::fromQualString("aten::_native_multi_head_attention");
const c10::Symbol kNativeEncoderLayer = c10::Symbol::fromQualString("aten::_transformer_encoder_layer_fwd");

// Inputs of aten::_native_multi_head_attention.
enum AttentionInput { kQuery, kKey, kValue, kNeedWeights = 10 };

bool unused(const jit::Value* value);

// Whether element `index` of `tuple` is read nowhere: unpacked or indexed into unused values, or
// returned from an if's branch as an output of the if that is itself unused there.
bool element_unused(const jit::Value* tuple, size_t index) {
  for (const jit::Use& use : tuple->uses()) {
    const jit::Node* user = use.user;
    const jit::Node* branch_owner = user->owningBlock()->owningNode();
    if (user->kind() == c10::prim::TupleUnpack) {
      if (!unused(user->output(index))) return false;
    } else if (user->kind() == c10::prim::Return && branch_owner && branch_owner->kind() == c10::prim::If) {
      if (!element_unused(branch_owner->output(use.offset), index)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// Whether `value` is read nowhere, following it into tuples and out of if branches: how
// MultiheadAttention's forward carries the attention weights its caller drops (`out, _ = ...`).
bool unused(const jit::Value* value) {
  for (const jit::Use& use : value->uses()) {
    const jit::Node* user = use.user;
    const jit::Node* branch_owner = user->owningBlock()->owningNode();
    if (user->kind() == c10::prim::TupleConstruct) {
      if (!element_unused(user->output(), use.offset)) return false;
    } else if (user->kind() == c10::prim::Return && branch_owner && branch_owner->kind() == c10::prim::If) {
      if (!unused(branch_owner->output(use.offset))) return false;
    } else {
      return false;
    }
  }
  return true;
}

bool routable(const jit::Node* node) {
  if (node->kind() == kNativeEncoderLayer) return true;
  if (node->kind() != kNativeAttention) return false;
  const jit::Value* x = node->input(kQuery);
  return node->input(kKey) == x && node->input(kValue) == x;
}

// The fast paths' calls in `block` and the blocks inside it (MultiheadAttention's sits in an if).
void collect_routable(jit::Block* block, std::vector<jit::Node*>& calls) {
  for (jit::Node* node : block->nodes()) {
    if (routable(node)) calls.push_back(node);
    for (jit::Block* inner : node->blocks()) collect_routable(inner, calls);
  }
}

// ---- The composed attention ----

// Whether the match's value `name` is a constant int among `allowed`.
bool constant_among(const jit::Match& match, const std::unordered_map<std::string, jit::Value*>& values,
                    const char* name, std::initializer_list<int64_t> allowed) {
  const auto constant = jit::toIValue(match.values_map.at(values.at(name)));
  if (!constant || !constant->isInt()) return false;
  return std::find(allowed.begin(), allowed.end(), constant->toInt()) != allowed.end();
}

// bmm(q, k^T) -> softmax over the keys (no dtype) -> bmm with v, 3-D [B, L, D] operands.
bool is_attention(const jit::Match& match, const std::unordered_map<std::string, jit::Value*>& values) {
  const auto dtype = jit::toIValue(match.values_map.at(values.at("dtype")));
  const bool swaps_last_two =
      (constant_among(match, values, "first", {-2, 1}) && constant_among(match, values, "second", {-1, 2})) ||
      (constant_among(match, values, "first", {-1, 2}) && constant_among(match, values, "second", {-2, 1}));
  return swaps_last_two && constant_among(match, values, "softmax_dim", {-1, 2}) && dtype && dtype->isNone();
}

}  // namespace

torch::Tensor self_attention(const torch::Tensor& x, int64_t embed_dim, int64_t num_heads, const AttentionWeights& w) {
  if (!computed_here(x, embed_dim, num_heads, w)) {
    return std::get<0>(at::_native_multi_head_attention(x, x, x, embed_dim, num_heads, w.qkv_weight, w.qkv_bias,
                                                        w.proj_weight, w.proj_bias, c10::nullopt, false));
  }
  const int64_t batch = x.size(0), length = x.size(1), head_dim = embed_dim / num_heads;
  // [B, L, 3, H, D]: q, k and v are [B, H, L, D] views of one projection, read where they lie.
  const torch::Tensor qkv =
      linear_on_onednn(x, w.qkv_weight.t(), w.qkv_bias).view({batch, length, 3, num_heads, head_dim});
  const auto part = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
  const torch::Tensor heads = kernels::attention(part(0), part(1), part(2));
  return linear_on_onednn(heads.transpose(1, 2).reshape({batch, length, embed_dim}), w.proj_weight.t(), w.proj_bias);
}

torch::Tensor encoder_layer(const torch::Tensor& src, int64_t embed_dim, int64_t num_heads,
                            const AttentionWeights& attention, const EncoderLayerWeights& w) {
  if (!computed_here(src, embed_dim, num_heads, attention, w)) {
    return at::_transformer_encoder_layer_fwd(src, embed_dim, num_heads, attention.qkv_weight, attention.qkv_bias,
                                              attention.proj_weight, attention.proj_bias, w.use_gelu, w.norm_first,
                                              w.eps, w.norm1_weight, w.norm1_bias, w.norm2_weight, w.norm2_bias,
                                              w.linear1_weight, w.linear1_bias, w.linear2_weight, w.linear2_bias);
  }
  const auto norm = [&](const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
    return kernels::layer_norm(x, {embed_dim}, weight, bias, w.eps);
  };
  // The sums are made into the block's own fresh result, never into src.
  if (w.norm_first) {
    const torch::Tensor x =
        self_attention(norm(src, w.norm1_weight, w.norm1_bias), embed_dim, num_heads, attention).add_(src);
    return feed_forward(norm(x, w.norm2_weight, w.norm2_bias), w).add_(x);
  }
  const torch::Tensor x =
      norm(self_attention(src, embed_dim, num_heads, attention).add_(src), w.norm1_weight, w.norm1_bias);
  return norm(feed_forward(x, w).add_(x), w.norm2_weight, w.norm2_bias);
}

// The native ops' schemas, the query also the key and the value. A call with a mask, or asking for
// the attention weights, is the native op's.
TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.def(
      "self_attention(Tensor x, int embed_dim, int num_heads, Tensor qkv_weight, Tensor qkv_bias, "
      "Tensor proj_weight, Tensor proj_bias, Tensor? mask=None, bool need_weights=True, "
      "bool average_attn_weights=True, int? mask_type=None) -> (Tensor, Tensor)",
      [](const torch::Tensor& x, int64_t embed_dim, int64_t num_heads, const torch::Tensor& qkv_weight,
         const torch::Tensor& qkv_bias, const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
         const c10::optional<torch::Tensor>& mask, bool need_weights, bool average_attn_weights,
         c10::optional<int64_t> mask_type) {
        if ((mask && mask->defined()) || need_weights) {
          return at::_native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                                  proj_bias, mask, need_weights, average_attn_weights, mask_type);
        }
        const torch::Tensor out =
            self_attention(x, embed_dim, num_heads, {qkv_weight, qkv_bias, proj_weight, proj_bias});
        return std::make_tuple(out, torch::Tensor());  // the native op's answer without weights
      });
  m.def(
      "encoder_layer(Tensor src, int embed_dim, int num_heads, Tensor qkv_weight, Tensor qkv_bias, "
      "Tensor proj_weight, Tensor proj_bias, bool use_gelu, bool norm_first, float eps, Tensor norm_weight_1, "
      "Tensor norm_bias_1, Tensor norm_weight_2, Tensor norm_bias_2, Tensor ffn_weight_1, Tensor ffn_bias_1, "
      "Tensor ffn_weight_2, Tensor ffn_bias_2, Tensor? mask=None, int? mask_type=None) -> Tensor",
      [](const torch::Tensor& src, int64_t embed_dim, int64_t num_heads, const torch::Tensor& qkv_weight,
         const torch::Tensor& qkv_bias, const torch::Tensor& proj_weight, const torch::Tensor& proj_bias, bool use_gelu,
         bool norm_first, double eps, const torch::Tensor& norm_weight_1, const torch::Tensor& norm_bias_1,
         const torch::Tensor& norm_weight_2, const torch::Tensor& norm_bias_2, const torch::Tensor& ffn_weight_1,
         const torch::Tensor& ffn_bias_1, const torch::Tensor& ffn_weight_2, const torch::Tensor& ffn_bias_2,
         const c10::optional<torch::Tensor>& mask, c10::optional<int64_t> mask_type) {
        if (mask && mask->defined()) {
          return at::_transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                                    proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
                                                    norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                                                    ffn_bias_2, mask, mask_type);
        }
        return encoder_layer(src, embed_dim, num_heads, {qkv_weight, qkv_bias, proj_weight, proj_bias},
                             {use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                              ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2});
      });
}

int fuse_composed_attention(std::shared_ptr<jit::Graph>& graph) {
  const auto count = [&] { return count_nodes(graph->block(), {"afterburner::attention"}); };
  const int before = count();
  jit::SubgraphRewriter rewriter;
  // q comes scaled (MultiheadAttention divides it by sqrt(D) first): the kernel's scale is 1.
  rewriter.RegisterRewritePattern(R"(
graph(%q, %k, %v, %first, %second, %softmax_dim, %dtype):
  %k_t = aten::transpose(%k, %first, %second)
  %scores = aten::bmm(%q, %k_t)
  %p = aten::softmax(%scores, %softmax_dim, %dtype)
  %out = aten::bmm(%p, %v)
  return (%out))",
                                  R"(
graph(%q, %k, %v, %first, %second, %softmax_dim, %dtype):
  %none : NoneType = prim::Constant()
  %causal : bool = prim::Constant[value=0]()
  %scale : float = prim::Constant[value=1.]()
  %out = afterburner::attention(%q, %k, %v, %none, %causal, %scale, %none)
  return (%out))");
  rewriter.runOnGraph(graph, is_attention);
  return count() - before;
}

int route_attention_fast_paths_to_ours(std::shared_ptr<jit::Graph>& graph) {
  std::vector<jit::Node*> calls;
  collect_routable(graph->block(), calls);
  for (jit::Node* call : calls) {
    if (call->kind() == kNativeEncoderLayer) {
      replace_by_call(call, "afterburner::encoder_layer", call->inputs());
    } else {
      std::vector<jit::Value*> inputs = call->inputs().vec();
      // need_weights is MultiheadAttention's default; weights nobody reads need not be computed.
      if (unused(call->output(1))) {
        const jit::WithInsertPoint insert_point(call);
        inputs[kNeedWeights] = graph->insertConstant(false);
      }
      inputs.erase(inputs.begin() + kKey, inputs.begin() + kValue + 1);
      replace_by_call(call, "afterburner::self_attention", inputs);
    }
  }
  return static_cast<int>(calls.size());
}

}  // namespace afterburner::infer
