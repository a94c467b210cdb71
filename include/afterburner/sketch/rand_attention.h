// RandMultiHeadAttention: multi-head attention with the softmax kernel replaced by random features
// (Performer's FAVOR+, as Panther's panther.nn.RandMultiHeadAttention), linear in the sequence
// length in time and memory. Its feature maps and contractions (causal too, by prefix states over
// blocks of 128 positions) are fused kernels with backward passes of their own (kernels/favor.h).
//
//   namespace sketch = afterburner::sketch;
//   sketch::RandMultiHeadAttention attention(sketch::RandMultiHeadAttentionOptions(256, 4, 128).causal(true));
//   torch::Tensor out = attention(x, x, x);                        // x [B, L, 256] -> [B, L, 256]
//
// Parameters Wq, Wk, Wv, W0 [E, E] (torch::nn::Linear's layout: y = x W^T + b), bq, bk, bv, b0 [E]
// (absent without bias), buffer projection_matrix [m, E / H]: Panther's names, so its
// state_dicts load.
#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <ostream>
#include <string>

#include "afterburner/sketch/feature_kernel.h"

namespace afterburner::sketch {

// m rows of dimension d: stacked blocks of d orthonormal rows (Q of the QR of a Gaussian d x d,
// the last block cut to m mod d rows), each row then scaled by the norm of a Gaussian d-vector
// (so that it is distributed as a Gaussian row, yet orthogonal to the others of its block).
// Drawn from a generator of its own seeded by `seed`: torch's default generator is neither read
// nor reseeded. float64, or `dtype`. Throws UsageError for sizes below 1.
torch::Tensor orthogonal_random_features(int64_t features, int64_t head_dim, uint64_t seed,
                                         torch::ScalarType dtype = torch::kFloat);

// phi(x) for x [..., L, d] (heads first, [B, H, L, d]) and the projection P [m, d], as Panther
// defines it:
//   softmax: m^-1/2 (exp(x^ P^T - |x^|^2 / 2 - s) + 1e-5), x^ = x d^-1/4, where s is the
//            maximum of x^ P^T over the m features (queries), and for keys also over the L
//            positions (one s per batch and head);
//   relu:    relu(m^-1/2 x P^T) + 1e-5.
// Differentiable (through s as well, as Panther's is).
torch::Tensor random_features(const torch::Tensor& x, const torch::Tensor& projection, FeatureKernel kernel,
                              bool is_query);

// out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) for q [B, L, H, d], k [B, S, H, d],
// v [B, S, H, dv] -> [B, L, H, dv]: non-causal as phi(Q) (phi(K)^T V), causal (j <= i, L = S)
// by prefix sums over blocks of 128 positions, never a state per position. `key_factors`
// [B, S, H] (optional) multiplies each key's term in the numerator only: dropout's noise (0 or
// 1 / (1 - p)). `query_keep` [B, L] and `key_keep` [B, S] (optional, bool) zero the features of
// masked queries and keys; a denominator that is then 0 counts as 1 (the output row is 0).
// In bf16 (and under autocast) the features and contractions run in fp32, the result rounded to
// the input's dtype. Throws UsageError naming the tensor whose shape does not fit.
torch::Tensor favor_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& projection, FeatureKernel kernel, bool causal,
                              const c10::optional<torch::Tensor>& key_factors = c10::nullopt,
                              const c10::optional<torch::Tensor>& query_keep = c10::nullopt,
                              const c10::optional<torch::Tensor>& key_keep = c10::nullopt);

struct RandMultiHeadAttentionOptions {
  RandMultiHeadAttentionOptions(int64_t embed_dim, int64_t num_heads, int64_t num_random_features)
      : embed_dim_(embed_dim), num_heads_(num_heads), num_random_features_(num_random_features) {}
  TORCH_ARG(int64_t, embed_dim);            // E, a multiple of num_heads
  TORCH_ARG(int64_t, num_heads);            // H
  TORCH_ARG(int64_t, num_random_features);  // m
  // Dropout of keys, in training: each key's term in every query's output of its head is kept
  // with probability 1 - p and scaled by 1 / (1 - p), the normaliser unchanged. nn.MultiheadAttention
  // drops (query, key) weights one by one, which needs the [L, S] weights; one draw per key has the
  // same expectation and stays linear in S.
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(FeatureKernel, kernel) = FeatureKernel::softmax;
  TORCH_ARG(bool, causal) = false;
  // The projection's seed. Unset: drawn from torch's default generator (torch::manual_seed
  // reproduces it), which is never reseeded.
  TORCH_ARG(c10::optional<uint64_t>, seed) = c10::nullopt;
};

// The layer's forward over given tensors (biases may be undefined): query [B, L, E], key and value
// [B, S, E] -> [B, L, E]. `attention_mask` (optional, bool [B, L, S], true = may attend, Panther's
// meaning) must mask whole query rows and key columns (padding): random features cannot hold any
// other mask, and one that is not of that form is a UsageError. `dropout` applies when `training`.
// Throws UsageError naming the argument whose shape or value does not fit.
torch::Tensor rand_multihead_attention(const torch::Tensor& query, const torch::Tensor& key,
                                       const torch::Tensor& value, const torch::Tensor& Wq, const torch::Tensor& Wk,
                                       const torch::Tensor& Wv, const torch::Tensor& W0, const torch::Tensor& bq,
                                       const torch::Tensor& bk, const torch::Tensor& bv, const torch::Tensor& b0,
                                       const torch::Tensor& projection, int64_t num_heads, FeatureKernel kernel,
                                       bool causal, double dropout, bool training,
                                       const c10::optional<torch::Tensor>& attention_mask = c10::nullopt);

// nn.MultiheadAttention's call on the random-feature layer (the layers `afterburner sketch` puts in
// place of a model's nn.MultiheadAttention): query [L, N, E], key and value [S, N, E] ([N, L, E]
// when batch_first; unbatched [L, E] too), output in the query's layout; MHA's masks, bool (true
// = ignored) or float (0 kept, -inf ignored): key_padding_mask [N, S], attn_mask [L, S] or
// [N * num_heads, L, S] (the same for every head). An attn_mask that is exactly the causal one
// (key j ignored by query i for j > i, nn.Transformer.generate_square_subsequent_mask's) makes
// the call causal; any other must mask whole query rows and key columns. Float masks holding
// other values than 0 and -inf are refused: random features cannot add them to scores.
// Throws UsageError naming the argument that does not fit.
torch::Tensor rand_multihead_attention_with_mha_masks(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const c10::optional<torch::Tensor>& key_padding_mask, const c10::optional<torch::Tensor>& attn_mask,
    bool batch_first, const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
    const torch::Tensor& W0, const torch::Tensor& bq, const torch::Tensor& bk, const torch::Tensor& bv,
    const torch::Tensor& b0, const torch::Tensor& projection, int64_t num_heads, FeatureKernel kernel, double dropout,
    bool training);

class RandMultiHeadAttentionImpl : public torch::nn::Cloneable<RandMultiHeadAttentionImpl> {
 public:
  // Xavier-uniform weights and zero biases, as Panther draws them. Throws UsageError naming the
  // option out of range.
  explicit RandMultiHeadAttentionImpl(const RandMultiHeadAttentionOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                        const c10::optional<torch::Tensor>& attention_mask = c10::nullopt);

  RandMultiHeadAttentionOptions options;
  torch::Tensor Wq, Wk, Wv, W0, bq, bk, bv, b0, projection_matrix;
};

TORCH_MODULE(RandMultiHeadAttention);

}  // namespace afterburner::sketch
