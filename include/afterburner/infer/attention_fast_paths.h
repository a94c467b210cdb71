// PyTorch's inference fast paths for attention, on afterburner's kernels. In evaluation (no grad
// recorded, batch_first, self-attention, no mask, an even number of heads)
// nn.MultiheadAttention calls aten::_native_multi_head_attention and nn.TransformerEncoderLayer
// calls aten::_transformer_encoder_layer_fwd; in LibTorch 1.13 both project on OpenBLAS and attend
// with a bmm, a softmax and a bmm over [L, L] scores: ViT-B/16's twelve attentions were 55% of its
// batch-32 inference, 36 ms each at batch 1. Here the projections and the feed-forward layers run
// on oneDNN's GEMM with their bias and GELU fused (linear_on_onednn), the heads on
// kernels::attention (tiled, online softmax), LayerNorm on kernels::layer_norm: ViT-B/16's
// attention 2.3x faster at batch 32 and 8x at batch 1, ViT-B/16 5.9x and 2.2x Python's frozen
// graph (BENCHMARKS.md, "PyTorch's attention fast paths on our kernels"). The rewritten graph
// calls operators registered by this library: it runs in this process and is not meant to be
// saved.
//
//   Module prepared = torch::jit::optimize_for_inference(frozen);
//   auto graph = prepared.get_method("forward").graph();
//   int routed = afterburner::infer::route_attention_fast_paths_to_ours(graph);
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>

namespace afterburner::infer {

// A multi-head self-attention's weights, as MultiheadAttention holds them: the packed q, k, v
// projection [3E, E] and its bias [3E], the output projection [E, E] and its bias [E].
struct AttentionWeights {
  torch::Tensor qkv_weight, qkv_bias, proj_weight, proj_bias;
};

// out = concat_h(softmax(q_h k_h^T / sqrt(D)) v_h) proj_weight^T + proj_bias, where
// [q | k | v] = x qkv_weight^T + qkv_bias, split into `num_heads` heads h of D = embed_dim /
// num_heads features: aten::_native_multi_head_attention(x, x, x, embed_dim, num_heads, ...)
// without a mask, its first output. x [B, L, E] fp32 or bf16 with weights of its dtype (bf16:
// products accumulated in fp32, as kernels::attention and oneDNN's matmul do). Any other input
// (nested, another rank or dtype, shapes the native op refuses, no rows) is handed to the native
// op, whose answer or error it then is.
torch::Tensor self_attention(const torch::Tensor& x, int64_t embed_dim, int64_t num_heads,
                             const AttentionWeights& weights);

// TransformerEncoderLayer's feed-forward block and LayerNorms: linear2(activation(linear1(x)))
// with GELU (erf form) or ReLU, and two LayerNorms of one eps.
struct EncoderLayerWeights {
  bool use_gelu = false;
  bool norm_first = false;
  double eps = 1e-5;
  torch::Tensor norm1_weight, norm1_bias, norm2_weight, norm2_bias;
  torch::Tensor linear1_weight, linear1_bias, linear2_weight, linear2_bias;
};

// aten::_transformer_encoder_layer_fwd without a mask: with sa = self_attention and ff the
// feed-forward block, norm_first: x = src + sa(norm1(src)); out = x + ff(norm2(x)); otherwise
// x = norm1(src + sa(src)); out = norm2(x + ff(x)). Inputs it does not compute (as for
// self_attention, and norm or feed-forward weights of other shapes or dtypes) go to the native op.
torch::Tensor encoder_layer(const torch::Tensor& src, int64_t embed_dim, int64_t num_heads,
                            const AttentionWeights& attention, const EncoderLayerWeights& layer);

// Rewrites aten::_native_multi_head_attention(x, x, x, ...) (one value for query, key and value)
// onto afterburner::self_attention and aten::_transformer_encoder_layer_fwd onto
// afterburner::encoder_layer, ops of the native ones' arguments: a call made with a mask, or
// asking for attention weights that are read (MultiheadAttention asks by default; weights the
// caller drops, `out, _ = attention(x, x, x)`, are not computed), runs the native op; the others
// compute the functions above (self_attention's weights output then undefined, as the native
// op's). Returns how many calls were rewritten.
int route_attention_fast_paths_to_ours(std::shared_ptr<torch::jit::Graph>& graph);

// Rewrites bmm(softmax(bmm(q, k.transpose(-2, -1)), -1), v) of 3-D operands, MultiheadAttention's
// composed forward (the path it takes where the fast path does not apply: batch_first False, its
// default, dropout, odd head counts; and traced with grad on), onto afterburner::attention with
// scale 1 (MultiheadAttention has scaled q already). Not where the probabilities are read
// elsewhere (the weights asked for). Returns how many were rewritten.
int fuse_composed_attention(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
