// kernels::attention's kernel for short key sequences (vision transformers' patches, a
// sentence's tokens: up to 128 keys). At 8 to 64 head dimensions and under a hundred keys the
// tiled kernel's block GEMM calls, and LibTorch's softmax over short rows, cost more than the
// arithmetic. Here one task takes a (batch, head) matrix (and, forward, a block of 64 query rows),
// holds its k and v rows in fp32, and computes 16 query rows at a time, one per vector lane: for
// each key, the 16 scores, then the softmax across keys lane by lane (no reduction across lanes),
// and the outputs 8 columns at a time in registers; or, at heads up to 8 wide, up to 20 rows and
// 32 matrices or more, 16 matrices at a time, one per lane (short_attention.cpp, "Matrices across
// lanes"). The numerics are the tiled kernel's (fp32 accumulation, the mask added, NaN and
// infinities where the unfused ops put them), and every task's order of sums is fixed, so the
// result does not depend on the thread count. Internal to src/kernels.
#pragma once

#include <torch/autograd.h>
#include <torch/types.h>

#include "attention_blocks.h"

namespace afterburner::kernels::attention_detail {

// fp32 attention over at most 128 keys, and bf16 with head dimensions up to 16.
bool short_kernel_applies(const torch::Tensor& q, int64_t k_len);

// q, k, v [batch..., len, dim] of one batch shape and dtype; mask additive and dropout the
// probabilities' factors, in fp32, expanded to [batch..., q_len, k_len], or undefined. out in q's
// dtype, lse in fp32.
ForwardResult short_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& mask, const torch::Tensor& dropout, bool causal, double scale);

// dq, dk, dv from the forward's out and lse, in q's dtype.
torch::autograd::variable_list short_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                              const torch::Tensor& mask, const torch::Tensor& dropout, bool causal,
                                              double scale,
                                              const torch::Tensor& out, const torch::Tensor& lse,
                                              const torch::Tensor& out_grad);

}  // namespace afterburner::kernels::attention_detail
