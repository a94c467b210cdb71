// Scaled-dot-product attention as one autograd node, tiled with an online softmax
// (FlashAttention-2 on the CPU): no [Lq, Lk] matrix is ever held, only a block of it per task.
//
//   namespace kernels = afterburner::kernels;
//   torch::Tensor out = kernels::attention(q, k, v);                  // q [B, H, Lq, D], k, v [B, H, Lk, D]
//   torch::Tensor gpt = kernels::attention(q, k, v, {}, /*causal=*/true);
//   torch::Tensor padded = kernels::attention(q, k, v, keep);         // keep: bool [B, 1, 1, Lk], true = attend
//   torch::Tensor dropped = kernels::attention(q, k, v, {}, false, {}, noise);  // noise: [B, H, Lq, Lk]
//   out.sum().backward();                                             // dq, dk, dv
//
// out = softmax(q k^T * scale + mask) v, the softmax over the keys, scale = 1/sqrt(D) unless
// given, and mask the sum of: attn_mask as given (float: added) or 0 where it is true and -inf
// where false (bool, true = attend, as torch 2.x's scaled_dot_product_attention), and -inf where
// the key's index exceeds the query's (causal, aligned at the top left: query i sees keys 0..i).
// With dropout_mask (factors broadcasting to the scores, as dropout's noise: 0 or 1 / (1 - p)),
// out = (softmax(...) * dropout_mask) v, as MultiheadAttention applies dropout to its weights
// before multiplying by v; it gets no gradient.
// The mask is added, never substituted, exactly as LibTorch's unfused ops would add it: a row that
// sees no key (all -inf) comes out NaN, as softmax makes it, and NaN and infinities reach the
// output and gradients where the unfused composition puts them.
//
// Shapes: q [..., Lq, D], k [..., Lk, D], v [..., Lk, Dv] -> out [..., Lq, Dv]; the leading
// dimensions of q, k, v and attn_mask's beyond its last two broadcast against each other, and
// attn_mask [..., Lq | 1, Lk | 1] broadcasts to the scores. dtypes float, double and bfloat16
// (q, k, v alike); under CPU autocast q, k and v run in the autocast dtype, as LibTorch's matmuls
// would. bf16 is computed in fp32: the products accumulate in fp32, the running max, sum and
// log-sum-exp are fp32, and only the result is rounded to bf16. Except where LibTorch's bf16
// matmuls are faster (a CPU with native bf16, fewer than 1,024 x 1,024 scores, and more than 128
// keys or head dimensions above 16): there the [Lq, Lk] scores are computed by them (fp32
// accumulation, rounded to bf16 as MultiheadAttention's are under autocast) and softmax-ed in
// fp32, the probabilities rounded to bf16 for the second matmul, LibTorch's ops and autograd
// throughout. A float mask is read in the accumulation dtype; it gets no gradient (a mask
// requiring grad is refused). The backward is differentiable itself (create_graph), through
// LibTorch's unfused ops.
//
// Two kernels, one result: up to 128 keys (a vision transformer's patches, a sentence; in bf16
// with head dimensions up to 16) 16 query rows at a time, one per vector lane, each row's scores
// held whole; beyond, tiled with GEMM blocks. Either keeps the output and one log-sum-exp per query row for the
// backward, which recomputes the probabilities. The short-key kernel reads q, k, v where they lie
// and lays its results out in their inputs' order of dimensions, so MultiheadAttention's
// transposes around it stay views. Dropout factors go to the short-key kernel, or else to the
// composition in LibTorch's ops (the tiled kernel takes none). CPU tensors only.
#pragma once

#include <c10/util/Optional.h>
#include <torch/types.h>

namespace afterburner::kernels {

// Throws UsageError naming the argument for shapes that do not fit, dtypes other than those above,
// q, k, v of different dtypes, a mask requiring grad, or a non-CPU tensor.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const c10::optional<torch::Tensor>& attn_mask = c10::nullopt, bool causal = false,
                        c10::optional<double> scale = c10::nullopt,
                        const c10::optional<torch::Tensor>& dropout_mask = c10::nullopt);

}  // namespace afterburner::kernels
