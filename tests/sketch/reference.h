// The sketched layers' definitions computed term by term, the independent references the
// sketch tests compare against (in double when given doubles).
#pragma once

#include <torch/types.h>

namespace afterburner::sketch::reference {

// 1/(2L) sum_i [ (X S1_i) U1_i + (X U2_i) S2_i ] + b, for X [B, d_in].
torch::Tensor sklinear(const torch::Tensor& x, const torch::Tensor& s1, const torch::Tensor& s2,
                       const torch::Tensor& u1, const torch::Tensor& u2, const torch::Tensor& bias);

// Y[:, o] = 1/(2L) sum_{i, kappa} U1_i[kappa, o] conv2d(X, S1s[i k + kappa]) + b[o].
torch::Tensor skconv2d(const torch::Tensor& x, const torch::Tensor& s1, const torch::Tensor& u1,
                       const torch::Tensor& bias, torch::IntArrayRef stride, torch::IntArrayRef padding);

// Panther's RandMultiHeadAttention forward (its rmha_forward and favor_attention) step by step:
// per-head features phi (softmax: m^-1/2 (exp(x^ P^T - |x^|^2/2 - max) + 1e-5), x^ = x d^-1/4, the
// max per row, for keys also over the positions; relu: relu(m^-1/2 x P^T) + 1e-5), features of
// positions that keep_queries / keep_keys (bool [B, L] / [B, S], or undefined) mask set to 0;
// non-causal phi(Q) (phi(K)^T V) / phi(Q) sum phi(K), causal by a running sum per position (the
// loop Panther runs), a zero normaliser counted as 1 when masked; key_factors [B, S, H] (or
// undefined) scale each key's value in the numerator. query [B, L, E], key and value [B, S, E].
torch::Tensor rand_mha(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                       const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
                       const torch::Tensor& W0, const torch::Tensor& bq, const torch::Tensor& bk,
                       const torch::Tensor& bv, const torch::Tensor& b0, const torch::Tensor& projection,
                       int64_t heads, bool softmax, bool causal, const torch::Tensor& keep_queries = {},
                       const torch::Tensor& keep_keys = {}, const torch::Tensor& key_factors = {});

// The exact attention RandMultiHeadAttention estimates: linear(softmax(q k^T / sqrt(d)) v, W0, b0)
// per head with q, k, v the projections of query, key and value.
torch::Tensor exact_mha(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                        const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
                        const torch::Tensor& W0, const torch::Tensor& bq, const torch::Tensor& bk,
                        const torch::Tensor& bv, const torch::Tensor& b0, int64_t heads, bool causal);

// ||actual - expected|| / ||expected||, computed in double.
double relative_error(const torch::Tensor& actual, const torch::Tensor& expected);

}  // namespace afterburner::sketch::reference
