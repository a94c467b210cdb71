// The two halves of random-feature (Performer, FAVOR+) attention as fused kernels with
// backward passes of their own: the feature maps phi(x) (one GEMM and one pass over its
// result, forward and backward) and the non-causal contraction phi(Q) (phi(K)^T V) / phi(Q)
// sum_j phi(k_j) (two GEMMs forward, four backward, the normaliser carried as an extra column of
// ones beside V so that no matrix-vector product is left; causal, by prefix states over blocks).
// RandMultiHeadAttention
// (sketch/rand_attention.h) is made of them.
//
//   namespace kernels = afterburner::kernels;
//   torch::Tensor qf = kernels::favor_features(q, projection, kernels::FavorFeatureMap::softmax_query);
//   torch::Tensor kf = kernels::favor_features(k, projection, kernels::FavorFeatureMap::softmax_key);
//   torch::Tensor out = kernels::favor_contraction(qf, kf, v);   // [..., L, dv]
//
// float and double tensors (bf16 attention computes its features in fp32: their exponentials
// would lose most of bf16's 8 bits). Under create_graph the gradients are LibTorch's ops on the
// same formulas, differentiable in turn.
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

// Which features: softmax (Panther's, without their factor m^-1/2, which cancels between the
// numerator and the normaliser) stabilised per query row or, for keys, per leading index (batch
// and head) over all its rows; or ReLU.
enum class FavorFeatureMap { softmax_query, softmax_key, relu };

// x [..., L, d], projection [m, d] -> [..., L, m]:
//   softmax: exp(x^ P^T - |x^|^2 / 2 - s) + 1e-5, x^ = x d^-1/4, s the maximum of x^ P^T over the
//            row (queries) or over every row of the leading index (keys);
//   relu:    relu(x P^T m^-1/2) + 1e-5.
// The maxima's gradient goes, as amax's, evenly to the positions that hold them.
torch::Tensor favor_features(const torch::Tensor& x, const torch::Tensor& projection, FavorFeatureMap map);

// query_features [..., L, m], key_features [..., S, m], values [..., S, dv] -> [..., L, dv]:
// row i is phi(q_i) (phi(K)^T V) / (phi(q_i) . sum_j phi(k_j)), the sums over every key, or with
// `causal` (S = L) over keys j <= i: in blocks of 128 positions, the masked [128, 128] products
// within a block and one [m, dv + 1] prefix state per block, never [L, m, dv] per position. A row
// whose normaliser is 0 (its features, or all the keys', masked to 0) is 0.
torch::Tensor favor_contraction(const torch::Tensor& query_features, const torch::Tensor& key_features,
                                const torch::Tensor& values, bool causal = false);

}  // namespace afterburner::kernels
