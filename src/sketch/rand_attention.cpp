#include "afterburner/sketch/rand_attention.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <torch/nn/init.h>

#include <cmath>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/random.h"
#include "afterburner/kernels/favor.h"
#include "afterburner/kernels/linear_relu.h"
#include "signs.h"

namespace afterburner::sketch {
namespace {

using detail::shape;

// The features attention uses: for softmax up to the factor m^-1/2, which cancels.
torch::Tensor attention_features(const torch::Tensor& x, const torch::Tensor& projection, FeatureKernel kernel,
                                 bool is_query) {
  using kernels::FavorFeatureMap;
  const FavorFeatureMap map = kernel == FeatureKernel::relu ? FavorFeatureMap::relu
                              : is_query                    ? FavorFeatureMap::softmax_query
                                                            : FavorFeatureMap::softmax_key;
  return kernels::favor_features(x, projection, map);
}

void check_favor_shapes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& projection, bool causal) {
  if (q.dim() != 4) throw UsageError("favor_attention q", "expected [B, L, H, d], got " + shape(q));
  const int64_t batch = q.size(0), heads = q.size(2), head_dim = q.size(3);
  if (k.dim() != 4 || k.size(0) != batch || k.size(2) != heads || k.size(3) != head_dim) {
    throw UsageError("favor_attention k", fmt::format("expected [{}, S, {}, {}], got {}", batch, heads, head_dim,
                                                      shape(k)));
  }
  if (v.dim() != 4 || v.size(0) != batch || v.size(1) != k.size(1) || v.size(2) != heads) {
    throw UsageError("favor_attention v", fmt::format("expected [{}, {}, {}, dv], got {}", batch, k.size(1), heads,
                                                      shape(v)));
  }
  if (projection.dim() != 2 || projection.size(1) != head_dim) {
    throw UsageError("favor_attention projection", fmt::format("expected [m, {}], got {}", head_dim, shape(projection)));
  }
  if (causal && k.size(1) != q.size(1)) {
    throw UsageError("favor_attention k", fmt::format("causal attention needs as many keys as queries ({}), got {}",
                                                      q.size(1), k.size(1)));
  }
}

void check_keep(const c10::optional<torch::Tensor>& keep, int64_t batch, int64_t length, const char* name) {
  if (keep && (keep->scalar_type() != torch::kBool || !keep->sizes().equals({batch, length}))) {
    throw UsageError(std::string("favor_attention ") + name,
                     fmt::format("expected bool [{}, {}], got {} {}", batch, length, c10::toString(keep->scalar_type()), shape(*keep)));
  }
}

// Features [B, H, L, m] of the positions keep [B, L] masks set to 0.
torch::Tensor kept(const torch::Tensor& features, const c10::optional<torch::Tensor>& keep) {
  if (!keep) return features;
  return features.masked_fill(keep->logical_not().view({keep->size(0), 1, keep->size(1), 1}), 0);
}

void check_projection_weights(const torch::Tensor& weight, const torch::Tensor& bias, int64_t embed_dim,
                              const char* weight_name, const char* bias_name) {
  if (!weight.sizes().equals({embed_dim, embed_dim})) {
    throw UsageError(std::string("RandMultiHeadAttention ") + weight_name,
                     fmt::format("expected [{}, {}], got {}", embed_dim, embed_dim, shape(weight)));
  }
  if (bias.defined() && !bias.sizes().equals({embed_dim})) {
    throw UsageError(std::string("RandMultiHeadAttention ") + bias_name,
                     fmt::format("expected [{}], got {}", embed_dim, shape(bias)));
  }
}

void check_inputs(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                  int64_t embed_dim) {
  if (query.dim() != 3 || query.size(2) != embed_dim) {
    throw UsageError("RandMultiHeadAttention query", fmt::format("expected [B, L, {}] (batch first), got {}",
                                                                 embed_dim, shape(query)));
  }
  const int64_t batch = query.size(0);
  if (key.dim() != 3 || key.size(0) != batch || key.size(2) != embed_dim) {
    throw UsageError("RandMultiHeadAttention key", fmt::format("expected [{}, S, {}], got {}", batch, embed_dim,
                                                               shape(key)));
  }
  if (!value.sizes().equals(key.sizes())) {
    throw UsageError("RandMultiHeadAttention value", fmt::format("expected the key's shape {}, got {}", shape(key),
                                                                 shape(value)));
  }
}

// The three input projections' biases as one [3E] vector (a missing one as zeros), or undefined
// without any.
torch::Tensor joined_bias(const torch::Tensor& bq, const torch::Tensor& bk, const torch::Tensor& bv,
                          const torch::Tensor& weight) {
  if (!bq.defined() && !bk.defined() && !bv.defined()) return {};
  auto or_zeros = [&](const torch::Tensor& b) { return b.defined() ? b : torch::zeros({weight.size(0)}, weight.options()); };
  return torch::cat({or_zeros(bq), or_zeros(bk), or_zeros(bv)});
}

struct PaddingMask {
  torch::Tensor queries, keys;  // bool [B, L] and [B, S]
};

// The rows and columns a bool [B, L, S] mask keeps; a mask that is not their outer product (it
// masks single query-key pairs) is refused: random features cannot hold it.
PaddingMask padding_of(const torch::Tensor& mask, int64_t batch, int64_t queries, int64_t keys) {
  if (mask.scalar_type() != torch::kBool || !mask.sizes().equals({batch, queries, keys})) {
    throw UsageError("RandMultiHeadAttention attention_mask",
                     fmt::format("expected bool [{}, {}, {}] (true = may attend), got {} {}", batch, queries, keys,
                                 c10::toString(mask.scalar_type()), shape(mask)));
  }
  PaddingMask padding{mask.any(-1), mask.any(-2)};
  if (!torch::equal(mask, padding.queries.unsqueeze(-1).logical_and(padding.keys.unsqueeze(-2)))) {
    throw UsageError("RandMultiHeadAttention attention_mask",
                     "masks single query-key pairs; random-feature attention holds only masks of whole query rows "
                     "and key columns (padding)");
  }
  return padding;
}

// nn.MultiheadAttention's masks as rand_multihead_attention takes them.
struct MhaMasks {
  c10::optional<torch::Tensor> allowed;  // bool [B, L, S], true = may attend
  bool causal = false;
};

// bool, true where MHA's mask ignores a key: the mask itself, or a float mask's -inf.
torch::Tensor ignored_by(const torch::Tensor& mask, const char* name) {
  const std::string field = std::string("nn.MultiheadAttention ") + name;
  if (mask.scalar_type() == torch::kBool) return mask;
  if (!mask.is_floating_point()) {
    throw UsageError(field, "expected a bool or floating-point mask, got " + std::string(c10::toString(mask.scalar_type())));
  }
  const torch::Tensor ignored = torch::isneginf(mask);
  if (!ignored.logical_or(mask == 0).all().item<bool>()) {
    throw UsageError(field, "holds values other than 0 and -inf: random-feature attention cannot add them to scores");
  }
  return ignored;
}

// attn_mask as [B, L, S] true = ignored, its heads' masks equal.
torch::Tensor ignored_by_attn_mask(const torch::Tensor& attn_mask, int64_t batch, int64_t heads, int64_t queries,
                                   int64_t keys) {
  const torch::Tensor ignored = ignored_by(attn_mask, "attn_mask");
  if (ignored.sizes().equals({queries, keys})) return ignored.unsqueeze(0).expand({batch, queries, keys});
  if (!ignored.sizes().equals({batch * heads, queries, keys})) {
    throw UsageError("nn.MultiheadAttention attn_mask", fmt::format("expected [{}, {}] or [{}, {}, {}], got {}", queries,
                                                                    keys, batch * heads, queries, keys, shape(attn_mask)));
  }
  const torch::Tensor per_head = ignored.view({batch, heads, queries, keys});
  const torch::Tensor first = per_head.select(1, 0);
  if (!torch::equal(per_head, first.unsqueeze(1).expand_as(per_head))) {
    throw UsageError("nn.MultiheadAttention attn_mask", "differs between heads: random-feature attention takes one mask");
  }
  return first;
}

MhaMasks mha_masks(const c10::optional<torch::Tensor>& key_padding_mask, const c10::optional<torch::Tensor>& attn_mask,
                   int64_t batch, int64_t heads, int64_t queries, int64_t keys) {
  MhaMasks masks;
  if (attn_mask) {
    const torch::Tensor ignored = ignored_by_attn_mask(*attn_mask, batch, heads, queries, keys);
    const auto later_keys = torch::ones({queries, keys}, ignored.options()).triu(1);
    masks.causal = queries == keys && torch::equal(ignored, later_keys.expand_as(ignored));
    if (!masks.causal) masks.allowed = ignored.logical_not();
  }
  if (key_padding_mask) {
    const torch::Tensor ignored = ignored_by(*key_padding_mask, "key_padding_mask");
    if (!ignored.sizes().equals({batch, keys})) {
      throw UsageError("nn.MultiheadAttention key_padding_mask",
                       fmt::format("expected [{}, {}], got {}", batch, keys, shape(*key_padding_mask)));
    }
    const torch::Tensor kept_keys = ignored.logical_not().unsqueeze(1).expand({batch, queries, keys});
    masks.allowed = masks.allowed ? masks.allowed->logical_and(kept_keys) : kept_keys;
  }
  return masks;
}

}  // namespace

FeatureKernel parse_feature_kernel(const std::string& name) {
  if (name == "softmax") return FeatureKernel::softmax;
  if (name == "relu") return FeatureKernel::relu;
  throw UsageError("kernel_fn", "expected 'softmax' or 'relu', got '" + name + "'");
}

std::string to_string(FeatureKernel kernel) { return kernel == FeatureKernel::softmax ? "softmax" : "relu"; }

torch::Tensor orthogonal_random_features(int64_t features, int64_t head_dim, uint64_t seed, torch::ScalarType dtype) {
  detail::require_at_least("orthogonal_random_features", 1,
                           {{"num_random_features", features}, {"head_dim", head_dim}});
  at::Generator generator = seeded_generator(seed);
  const auto options = torch::dtype(torch::kDouble);
  std::vector<torch::Tensor> blocks;
  for (int64_t rows = 0; rows < features; rows += head_dim) {
    const torch::Tensor orthonormal = std::get<0>(torch::linalg_qr(torch::randn({head_dim, head_dim}, generator, options)));
    blocks.push_back(orthonormal.t().narrow(0, 0, std::min(head_dim, features - rows)));
  }
  const torch::Tensor norms = torch::randn({features, head_dim}, generator, options).norm(2, {1}, /*keepdim=*/true);
  return (torch::cat(blocks, 0) * norms).to(dtype);
}

torch::Tensor random_features(const torch::Tensor& x, const torch::Tensor& projection, FeatureKernel kernel,
                              bool is_query) {
  const torch::Tensor features = attention_features(x, projection, kernel, is_query);
  if (kernel == FeatureKernel::relu) return features;
  return features * (1.0 / std::sqrt(static_cast<double>(projection.size(0))));
}

// out = N / D with N = phi(Q) (phi(K)^T (V * key_factors)) and D = phi(Q) sum_j phi(k_j), non-causal;
// causal, [N | D] = the prefix products of phi(Q), phi(K) and [V * key_factors | 1]. Heads first
// ([B, H, L, .], contiguous), so that every product is one batched GEMM over whole heads.
torch::Tensor favor_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& projection, FeatureKernel kernel, bool causal,
                              const c10::optional<torch::Tensor>& key_factors,
                              const c10::optional<torch::Tensor>& query_keep,
                              const c10::optional<torch::Tensor>& key_keep) {
  check_favor_shapes(q, k, v, projection, causal);
  const int64_t batch = q.size(0), keys = k.size(1), heads = q.size(2);
  check_keep(query_keep, batch, q.size(1), "query_keep");
  check_keep(key_keep, batch, keys, "key_keep");
  if (key_factors && !key_factors->sizes().equals({batch, keys, heads})) {
    throw UsageError("favor_attention key_factors",
                     fmt::format("expected [{}, {}, {}], got {}", batch, keys, heads, shape(*key_factors)));
  }
  // bf16 keeps 8 bits, and the features' exponentials would lose most of them: below fp32 the
  // features and both contractions run in fp32 (autocast off), only the result is rounded back.
  const torch::ScalarType dtype = q.scalar_type();
  const torch::ScalarType compute = (dtype == torch::kBFloat16 || dtype == torch::kHalf) ? torch::kFloat : dtype;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  auto heads_first = [&](const torch::Tensor& t) { return t.to(compute).transpose(1, 2).contiguous(); };
  const torch::Tensor p = projection.to(compute);
  const torch::Tensor qf = kept(attention_features(heads_first(q), p, kernel, true), query_keep);  // [B, H, L, m]
  const torch::Tensor kf = kept(attention_features(heads_first(k), p, kernel, false), key_keep);  // [B, H, S, m]
  torch::Tensor values = heads_first(v);  // [B, H, S, dv]
  if (key_factors) values = values * key_factors->to(compute).transpose(1, 2).unsqueeze(-1);
  return kernels::favor_contraction(qf, kf, values, causal).transpose(1, 2).to(dtype);  // [B, L, H, dv]
}

torch::Tensor rand_multihead_attention(const torch::Tensor& query, const torch::Tensor& key,
                                       const torch::Tensor& value, const torch::Tensor& Wq, const torch::Tensor& Wk,
                                       const torch::Tensor& Wv, const torch::Tensor& W0, const torch::Tensor& bq,
                                       const torch::Tensor& bk, const torch::Tensor& bv, const torch::Tensor& b0,
                                       const torch::Tensor& projection, int64_t num_heads, FeatureKernel kernel,
                                       bool causal, double dropout, bool training,
                                       const c10::optional<torch::Tensor>& attention_mask) {
  const int64_t embed_dim = Wq.dim() == 2 ? Wq.size(1) : 0;
  if (num_heads < 1 || embed_dim % num_heads != 0) {
    throw UsageError("RandMultiHeadAttention num_heads",
                     fmt::format("must divide embed_dim {} and be at least 1, got {}", embed_dim, num_heads));
  }
  check_projection_weights(Wq, bq, embed_dim, "Wq", "bq");
  check_projection_weights(Wk, bk, embed_dim, "Wk", "bk");
  check_projection_weights(Wv, bv, embed_dim, "Wv", "bv");
  check_projection_weights(W0, b0, embed_dim, "W0", "b0");
  check_inputs(query, key, value, embed_dim);
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw UsageError("RandMultiHeadAttention dropout", fmt::format("must be in [0, 1), got {}", dropout));
  }
  const int64_t batch = query.size(0), queries = query.size(1), keys = key.size(1);
  const int64_t head_dim = embed_dim / num_heads;
  torch::Tensor q, k, v;
  if (query.is_same(key) && key.is_same(value)) {  // self-attention: one GEMM for the three
    const std::vector<torch::Tensor> qkv =
        kernels::linear(query, torch::cat({Wq, Wk, Wv}), joined_bias(bq, bk, bv, Wq)).chunk(3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = kernels::linear(query, Wq, bq), k = kernels::linear(key, Wk, bk), v = kernels::linear(value, Wv, bv);
  }
  q = q.view({batch, queries, num_heads, head_dim});
  k = k.view({batch, keys, num_heads, head_dim});
  v = v.view({batch, keys, num_heads, head_dim});
  c10::optional<torch::Tensor> key_factors;
  if (training && dropout > 0) {
    key_factors = torch::empty({batch, keys, num_heads}, v.options()).bernoulli_(1 - dropout).div_(1 - dropout);
  }
  c10::optional<PaddingMask> padding;
  if (attention_mask) padding = padding_of(*attention_mask, batch, queries, keys);
  const torch::Tensor attended =
      favor_attention(q, k, v, projection, kernel, causal, key_factors,
                      padding ? c10::optional<torch::Tensor>(padding->queries) : c10::nullopt,
                      padding ? c10::optional<torch::Tensor>(padding->keys) : c10::nullopt);
  return kernels::linear(attended.reshape({batch, queries, embed_dim}), W0, b0);
}

torch::Tensor rand_multihead_attention_with_mha_masks(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const c10::optional<torch::Tensor>& key_padding_mask, const c10::optional<torch::Tensor>& attn_mask,
    bool batch_first, const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
    const torch::Tensor& W0, const torch::Tensor& bq, const torch::Tensor& bk, const torch::Tensor& bv,
    const torch::Tensor& b0, const torch::Tensor& projection, int64_t num_heads, FeatureKernel kernel, double dropout,
    bool training) {
  // Batch first, as rand_multihead_attention takes them; one tensor for the three in
  // self-attention, so that it projects them with one GEMM.
  const bool unbatched = query.dim() == 2;
  auto batch_first_of = [&](const torch::Tensor& x) {
    if (unbatched) return x.unsqueeze(0);
    return batch_first || x.dim() != 3 ? x : x.transpose(0, 1);
  };
  const torch::Tensor q = batch_first_of(query);
  const torch::Tensor k = key.is_same(query) ? q : batch_first_of(key);
  const torch::Tensor v = value.is_same(key) ? k : batch_first_of(value);
  check_inputs(q, k, v, Wq.dim() == 2 ? Wq.size(1) : 0);
  c10::optional<torch::Tensor> padding = key_padding_mask;
  if (unbatched && padding) padding = padding->unsqueeze(0);
  const MhaMasks masks = mha_masks(padding, attn_mask, q.size(0), num_heads, q.size(1), k.size(1));
  const torch::Tensor out = rand_multihead_attention(q, k, v, Wq, Wk, Wv, W0, bq, bk, bv, b0, projection, num_heads,
                                                     kernel, masks.causal, dropout, training, masks.allowed);
  if (unbatched) return out.squeeze(0);
  return batch_first ? out : out.transpose(0, 1);
}

RandMultiHeadAttentionImpl::RandMultiHeadAttentionImpl(const RandMultiHeadAttentionOptions& options)
    : options(options) {
  reset();
}

void RandMultiHeadAttentionImpl::reset() {
  const int64_t embed_dim = options.embed_dim(), heads = options.num_heads();
  detail::require_at_least("RandMultiHeadAttention", 1,
                           {{"embed_dim", embed_dim}, {"num_heads", heads},
                            {"num_random_features", options.num_random_features()}});
  if (embed_dim % heads != 0) {
    throw UsageError("RandMultiHeadAttention num_heads",
                     fmt::format("must divide embed_dim {}, got {}", embed_dim, heads));
  }
  if (!(options.dropout() >= 0.0 && options.dropout() < 1.0)) {
    throw UsageError("RandMultiHeadAttention dropout", fmt::format("must be in [0, 1), got {}", options.dropout()));
  }
  if (!options.seed()) options.seed(draw_seed());
  auto weight = [&](const char* name) {
    torch::Tensor w = torch::empty({embed_dim, embed_dim});
    torch::nn::init::xavier_uniform_(w);
    return register_parameter(name, w);
  };
  Wq = weight("Wq");
  Wk = weight("Wk");
  Wv = weight("Wv");
  W0 = weight("W0");
  if (options.bias()) {
    bq = register_parameter("bq", torch::zeros({embed_dim}));
    bk = register_parameter("bk", torch::zeros({embed_dim}));
    bv = register_parameter("bv", torch::zeros({embed_dim}));
    b0 = register_parameter("b0", torch::zeros({embed_dim}));
  }
  projection_matrix = register_buffer(
      "projection_matrix", orthogonal_random_features(options.num_random_features(), embed_dim / heads, *options.seed()));
}

torch::Tensor RandMultiHeadAttentionImpl::forward(const torch::Tensor& query, const torch::Tensor& key,
                                                  const torch::Tensor& value,
                                                  const c10::optional<torch::Tensor>& attention_mask) {
  return rand_multihead_attention(query, key, value, Wq, Wk, Wv, W0, bq, bk, bv, b0, projection_matrix,
                                  options.num_heads(), options.kernel(), options.causal(), options.dropout(),
                                  is_training(), attention_mask);
}

void RandMultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "afterburner::sketch::RandMultiHeadAttention(embed_dim={}, num_heads={}, num_random_features={}, dropout={}, "
      "bias={}, kernel_fn={}, causal={})",
      options.embed_dim(), options.num_heads(), options.num_random_features(), options.dropout(), options.bias(),
      to_string(options.kernel()), options.causal());
}

}  // namespace afterburner::sketch

