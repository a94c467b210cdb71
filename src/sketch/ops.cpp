// The sketched layers as dispatcher ops beside the fused kernels (src/kernels/ops.cpp), for the
// Python package's afterburner.nn.SKLinear and SKConv2d and for TorchScript files that use them.
// All are composite: gradients flow through the kernels they are made of.
#include <torch/library.h>

#include <tuple>

#include "afterburner/sketch/rand_attention.h"
#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::sketch {
namespace {

torch::Tensor sketched_linear_op(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& S2s,
                                 const torch::Tensor& U1s, const torch::Tensor& U2s,
                                 const c10::optional<torch::Tensor>& bias, bool relu, double dropout, bool train) {
  return sketched_linear(input, S1s, S2s, U1s, U2s, bias.value_or(torch::Tensor()),
                         kernels::LowRankEpilogue().relu(relu).dropout(dropout).train(train));
}

std::tuple<torch::Tensor, torch::Tensor, double> sklinear_factors_op(const torch::Tensor& S1s, const torch::Tensor& S2s,
                                                                    const torch::Tensor& U1s, const torch::Tensor& U2s) {
  const SKLinearFactors factors = sklinear_factors(S1s, S2s, U1s, U2s);
  return {factors.first, factors.second, factors.scale};
}

torch::Tensor sketched_linear_factored_op(const torch::Tensor& input, const torch::Tensor& first,
                                          const torch::Tensor& second, double scale,
                                          const c10::optional<torch::Tensor>& bias, bool relu, double dropout,
                                          bool train) {
  return sketched_linear(input, SKLinearFactors{first, second, scale}, bias.value_or(torch::Tensor()),
                         kernels::LowRankEpilogue().relu(relu).dropout(dropout).train(train));
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> initial_sklinear_op(
    int64_t in_features, int64_t out_features, int64_t num_terms, int64_t low_rank,
    const c10::optional<torch::Tensor>& W_init, bool bias) {
  const SKLinearTensors tensors = initial_sklinear_tensors(
      SKLinearOptions(in_features, out_features).terms(num_terms).rank(low_rank).bias(bias),
      W_init.value_or(torch::Tensor()));
  return {tensors.S1s, tensors.S2s, tensors.U1s, tensors.U2s, tensors.bias};
}

torch::Tensor sketched_conv2d_op(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& U1s,
                                 const c10::optional<torch::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding) {
  return sketched_conv2d(input, S1s, U1s, bias.value_or(torch::Tensor()), stride, padding);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> initial_skconv2d_op(
    int64_t in_channels, int64_t out_channels, c10::IntArrayRef kernel_size, int64_t num_terms, int64_t low_rank,
    const c10::optional<torch::Tensor>& weight, bool bias) {
  const SKConv2dTensors tensors = initial_skconv2d_tensors(
      SKConv2dOptions(in_channels, out_channels, kernel_size).terms(num_terms).rank(low_rank).bias(bias),
      weight.value_or(torch::Tensor()));
  return {tensors.S1s, tensors.U1s, tensors.bias};
}

torch::Tensor rand_mha_op(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                          const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
                          const torch::Tensor& W0, const c10::optional<torch::Tensor>& bq,
                          const c10::optional<torch::Tensor>& bk, const c10::optional<torch::Tensor>& bv,
                          const c10::optional<torch::Tensor>& b0, const torch::Tensor& projection_matrix,
                          int64_t num_heads, c10::string_view kernel_fn, bool causal, double dropout, bool training,
                          const c10::optional<torch::Tensor>& attention_mask) {
  const torch::Tensor none;
  return rand_multihead_attention(query, key, value, Wq, Wk, Wv, W0, bq.value_or(none), bk.value_or(none),
                                  bv.value_or(none), b0.value_or(none), projection_matrix, num_heads,
                                  parse_feature_kernel(std::string(kernel_fn)), causal, dropout, training,
                                  attention_mask);
}

torch::Tensor rand_mha_with_mha_masks_op(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                                         const c10::optional<torch::Tensor>& key_padding_mask,
                                         const c10::optional<torch::Tensor>& attn_mask, bool batch_first,
                                         const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
                                         const torch::Tensor& W0, const c10::optional<torch::Tensor>& bq,
                                         const c10::optional<torch::Tensor>& bk, const c10::optional<torch::Tensor>& bv,
                                         const c10::optional<torch::Tensor>& b0, const torch::Tensor& projection_matrix,
                                         int64_t num_heads, c10::string_view kernel_fn, double dropout, bool training) {
  const torch::Tensor none;
  return rand_multihead_attention_with_mha_masks(
      query, key, value, key_padding_mask, attn_mask, batch_first, Wq, Wk, Wv, W0, bq.value_or(none),
      bk.value_or(none), bv.value_or(none), b0.value_or(none), projection_matrix, num_heads,
      parse_feature_kernel(std::string(kernel_fn)), dropout, training);
}

torch::Tensor favor_attention_op(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& projection_matrix, c10::string_view kernel_fn, bool causal) {
  return favor_attention(q, k, v, projection_matrix, parse_feature_kernel(std::string(kernel_fn)), causal);
}

torch::Tensor orthogonal_random_features_op(int64_t num_random_features, int64_t head_dim, int64_t seed,
                                            c10::optional<torch::ScalarType> dtype) {
  return orthogonal_random_features(num_random_features, head_dim, static_cast<uint64_t>(seed),
                                    dtype.value_or(torch::kFloat));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(afterburner, m) {
  // 1/(2L) sum_i [(x S1s[i]) U1s[i] + (x U2s[i]) S2s[i]] + bias, as two GEMMs (SKLinear's forward);
  // then relu where asked, then dropout with probability `dropout` in training, in the same node.
  m.def("sklinear(Tensor input, Tensor S1s, Tensor S2s, Tensor U1s, Tensor U2s, Tensor? bias=None, bool relu=False, "
        "float dropout=0.0, bool train=False) -> Tensor",
        sketched_linear_op);
  // The same in two steps, for a layer whose S1s and S2s do not change between calls (inference):
  // its GEMM operands first [in, w] and second [w, out] and the scale 1/(2L), made once, then
  // scale (input first) second + bias on each call.
  m.def("sklinear_factors(Tensor S1s, Tensor S2s, Tensor U1s, Tensor U2s) -> (Tensor, Tensor, float)",
        sklinear_factors_op);
  m.def("sklinear_factored(Tensor input, Tensor first, Tensor second, float scale, Tensor? bias=None, "
        "bool relu=False, float dropout=0.0, bool train=False) -> Tensor",
        sketched_linear_factored_op);
  // SKLinear's initial tensors: S1s, S2s, U1s, U2s and bias (None without one), from W_init
  // ([out_features, in_features], torch.nn.Linear's layout) or from torch.nn.Linear's draw.
  m.def("sklinear_init(int in_features, int out_features, int num_terms, int low_rank, Tensor? W_init=None, "
        "bool bias=True) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        initial_sklinear_op);
  // 1/(2L) sum_{i, kappa} U1s[i, kappa, :] conv2d(input, S1s[i k + kappa]) + bias (SKConv2d's forward).
  m.def("skconv2d(Tensor input, Tensor S1s, Tensor U1s, Tensor? bias=None, int[2] stride=1, int[2] padding=0) -> "
        "Tensor",
        sketched_conv2d_op);
  // SKConv2d's initial tensors: S1s, U1s and bias (None without one), from weight ([out_channels,
  // in_channels, Kh, Kw], torch.nn.Conv2d's layout) or from torch.nn.Conv2d's draw.
  m.def("skconv2d_init(int in_channels, int out_channels, int[2] kernel_size, int num_terms, int low_rank, "
        "Tensor? weight=None, bool bias=True) -> (Tensor, Tensor, Tensor)",
        initial_skconv2d_op);
  // RandMultiHeadAttention's forward (Performer's FAVOR+, Panther's definition): linear(attention(
  // linear(query, Wq, bq), linear(key, Wk, bk), linear(value, Wv, bv)), W0, b0) with random-feature
  // attention per head; batch first; attention_mask bool [B, L, S], true = may attend (padding only).
  m.def("rand_mha(Tensor query, Tensor key, Tensor value, Tensor Wq, Tensor Wk, Tensor Wv, Tensor W0, Tensor? bq, "
        "Tensor? bk, Tensor? bv, Tensor? b0, Tensor projection_matrix, int num_heads, str kernel_fn='softmax', "
        "bool causal=False, float dropout=0.0, bool training=False, Tensor? attention_mask=None) -> Tensor",
        rand_mha_op);
  // The same with nn.MultiheadAttention's layout and masks (sequence first unless batch_first;
  // key_padding_mask, attn_mask; a causal attn_mask makes it causal): the forward of the layers
  // `afterburner sketch` puts in place of nn.MultiheadAttention.
  m.def("rand_mha_with_mha_masks(Tensor query, Tensor key, Tensor value, Tensor? key_padding_mask, "
        "Tensor? attn_mask, bool batch_first, Tensor Wq, Tensor Wk, Tensor Wv, Tensor W0, Tensor? bq, Tensor? bk, "
        "Tensor? bv, Tensor? b0, Tensor projection_matrix, int num_heads, str kernel_fn='softmax', "
        "float dropout=0.0, bool training=False) -> Tensor",
        rand_mha_with_mha_masks_op);
  // sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) per head, q [B, L, H, d], k, v [B, S, H, d].
  m.def("favor_attention(Tensor q, Tensor k, Tensor v, Tensor projection_matrix, str kernel_fn='softmax', "
        "bool causal=False) -> Tensor",
        favor_attention_op);
  // [m, d] orthogonal random features (blocks of orthonormal rows scaled by Gaussian norms), from
  // a generator of their own seeded by `seed`.
  m.def("orthogonal_random_features(int num_random_features, int head_dim, int seed, ScalarType? dtype=None) -> Tensor",
        orthogonal_random_features_op);
}

}  // namespace afterburner::sketch
