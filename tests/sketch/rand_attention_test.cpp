// RandMultiHeadAttention against Panther's definition in double (reference::rand_mha, its
// per-position loop for the causal case), against exact softmax attention as the number of
// features grows, and its projection, dropout, masks and errors.
#include "afterburner/sketch/rand_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "afterburner/core/error.h"
#include "reference.h"
#include "testing.h"

namespace afterburner::sketch {
namespace {

struct Sizes {
  int64_t batch, queries, keys, embed_dim, heads, features;
};

std::vector<torch::Tensor> weights_of(const RandMultiHeadAttention& layer) {
  return {layer->Wq, layer->Wk, layer->Wv, layer->W0, layer->bq, layer->bk, layer->bv, layer->b0};
}

// Panther's definition over the layer's own tensors.
torch::Tensor reference_of(const RandMultiHeadAttention& layer, const torch::Tensor& query, const torch::Tensor& key,
                           const torch::Tensor& value, const std::vector<torch::Tensor>& w,
                           const torch::Tensor& keep_queries = {}, const torch::Tensor& keep_keys = {},
                           const torch::Tensor& key_factors = {}) {
  const auto& o = layer->options;
  return reference::rand_mha(query, key, value, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
                             layer->projection_matrix, o.num_heads(), o.kernel() == FeatureKernel::softmax,
                             o.causal(), keep_queries, keep_keys, key_factors);
}

RandMultiHeadAttention double_layer(const Sizes& s, FeatureKernel kernel, bool causal, bool bias) {
  RandMultiHeadAttention layer(RandMultiHeadAttentionOptions(s.embed_dim, s.heads, s.features)
                                   .kernel(kernel)
                                   .causal(causal)
                                   .bias(bias));
  layer->to(torch::kDouble);
  if (bias) {  // Panther starts them at 0, which would leave their use untested
    torch::NoGradGuard no_grad;
    for (auto* b : {&layer->bq, &layer->bk, &layer->bv, &layer->b0}) b->normal_(0, 0.1);
  }
  return layer;
}

class RandAttentionDefinition
    : public ::testing::TestWithParam<std::tuple<Sizes, FeatureKernel, bool /*causal*/, bool /*bias*/>> {};

TEST_P(RandAttentionDefinition, ForwardAndGradientsEqualPanthersInDoubleAndRepeat) {
  const auto& [s, kernel, causal, bias] = GetParam();
  if (causal && s.queries != s.keys) GTEST_SKIP() << "causal attention takes as many keys as queries";
  torch::manual_seed(11);
  RandMultiHeadAttention layer = double_layer(s, kernel, causal, bias);
  const auto options = torch::dtype(torch::kDouble).requires_grad(true);
  const torch::Tensor query = torch::randn({s.batch, s.queries, s.embed_dim}, options);
  const torch::Tensor key = torch::randn({s.batch, s.keys, s.embed_dim}, options);
  const torch::Tensor value = torch::randn({s.batch, s.keys, s.embed_dim}, options);

  const torch::Tensor out = layer(query, key, value);
  ASSERT_EQ(out.sizes(), query.sizes());
  EXPECT_TRUE(torch::equal(out, layer(query, key, value))) << "a second call";
  std::vector<torch::Tensor> trained{query, key, value, layer->Wq, layer->Wk, layer->Wv, layer->W0};
  if (bias) trained.insert(trained.end(), {layer->bq, layer->bk, layer->bv, layer->b0});
  const torch::Tensor upstream = torch::randn_like(out);
  const auto grads = torch::autograd::grad({out}, trained, {upstream});

  const torch::Tensor expected = reference_of(layer, query, key, value, weights_of(layer));
  const auto expected_grads = torch::autograd::grad({expected}, trained, {upstream});
  EXPECT_LE(reference::relative_error(out, expected), 1e-10);
  // Relative to at least 1: with one key the output is that key's value whatever q and k are, and
  // the gradients of Wq, Wk, bq and bk are rounding noise around 0 in both.
  for (size_t i = 0; i < trained.size(); ++i) {
    const double difference = (grads[i] - expected_grads[i]).norm().item<double>();
    EXPECT_LE(difference, 1e-10 * std::max(1.0, expected_grads[i].norm().item<double>())) << "gradient " << i;
  }
}

// One row; odd sizes; 130 and 300 positions cross the causal blocks of 128 (one short block, and
// two full ones and a short one); more keys than queries and fewer.
INSTANTIATE_TEST_SUITE_P(Shapes, RandAttentionDefinition,
                         ::testing::Combine(::testing::Values(Sizes{1, 1, 1, 8, 2, 4}, Sizes{2, 7, 7, 12, 3, 5},
                                                              Sizes{3, 130, 130, 16, 2, 20},
                                                              Sizes{1, 300, 300, 8, 1, 16}, Sizes{2, 5, 9, 8, 1, 8},
                                                              Sizes{2, 9, 4, 6, 2, 7}),
                                            ::testing::Values(FeatureKernel::softmax, FeatureKernel::relu),
                                            ::testing::Bool(), ::testing::Bool()));

TEST(OrthogonalRandomFeatures, BlocksOfOrthogonalRowsWithGaussianNorms) {
  const int64_t d = 16, m = 70;  // four full blocks and one of 6 rows
  const torch::Tensor p = orthogonal_random_features(m, d, 3, torch::kDouble);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{m, d}));
  for (int64_t start = 0; start < m; start += d) {
    const torch::Tensor block = p.narrow(0, start, std::min(d, m - start));
    const torch::Tensor gram = block.mm(block.t());
    const torch::Tensor off_diagonal = gram - torch::diag(gram.diagonal());
    EXPECT_LE(off_diagonal.abs().max().item<double>(), 1e-12 * gram.diagonal().max().item<double>()) << start;
  }
  // Squared row norms follow chi-square with d degrees of freedom: mean d, sd sqrt(2d) / sqrt(m).
  const double mean_square = p.square().sum(1).mean().item<double>();
  EXPECT_NEAR(mean_square, d, 5 * std::sqrt(2.0 * d / m));
  // Rows of different blocks are independent, not orthogonal.
  EXPECT_GT(p.narrow(0, 0, d).mm(p.narrow(0, d, d).t()).abs().max().item<double>(), 1e-3);
}

TEST(OrthogonalRandomFeatures, SeededByItsOwnGeneratorWithoutTouchingTorchs) {
  EXPECT_TRUE(torch::equal(orthogonal_random_features(32, 8, 5), orthogonal_random_features(32, 8, 5)));
  EXPECT_FALSE(torch::equal(orthogonal_random_features(32, 8, 5), orthogonal_random_features(32, 8, 6)));
  torch::manual_seed(123);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(123);
  orthogonal_random_features(32, 8, 5);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected)) << "torch's default generator was read or reseeded";
  // Unseeded layers draw their seed from torch's generator: two layers differ, manual_seed repeats them.
  torch::manual_seed(1);
  RandMultiHeadAttention first(RandMultiHeadAttentionOptions(16, 2, 8));
  RandMultiHeadAttention second(RandMultiHeadAttentionOptions(16, 2, 8));
  torch::manual_seed(1);
  RandMultiHeadAttention again(RandMultiHeadAttentionOptions(16, 2, 8));
  EXPECT_FALSE(torch::equal(first->projection_matrix, second->projection_matrix));
  EXPECT_TRUE(torch::equal(first->projection_matrix, again->projection_matrix));
  EXPECT_EQ(*first->options.seed(), *again->options.seed());
}

// The softmax features estimate exp(q.k / sqrt(d)) with variance falling as 1/m: the error
// against exact attention falls about as 1/sqrt(m) (a slope near -1/2 in log-log), averaged
// over draws of the projection.
TEST(RandMultiHeadAttention, ErrorAgainstExactAttentionFallsAsOneOverSqrtFeatures) {
  for (const bool causal : {false, true}) {
    const std::vector<int64_t> feature_counts{8, 32, 128, 512};
    std::vector<double> errors;
    for (const int64_t m : feature_counts) {
      double sum = 0;
      const int draws = 12;
      for (int seed = 0; seed < draws; ++seed) {
        torch::manual_seed(100 + seed);
        RandMultiHeadAttention layer(
            RandMultiHeadAttentionOptions(32, 2, m).causal(causal).seed(static_cast<uint64_t>(seed)));
        layer->to(torch::kDouble);
        const torch::Tensor x = torch::randn({2, 64, 32}, torch::kDouble) * 0.5;
        torch::NoGradGuard no_grad;
        const auto w = weights_of(layer);
        const torch::Tensor exact =
            reference::exact_mha(x, x, x, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], 2, causal);
        sum += reference::relative_error(layer(x, x, x), exact);
      }
      errors.push_back(sum / draws);
    }
    for (size_t i = 1; i < errors.size(); ++i) EXPECT_LT(errors[i], errors[i - 1]) << "m = " << feature_counts[i];
    const double slope = std::log(errors.back() / errors.front()) / std::log(512.0 / 8.0);
    EXPECT_NEAR(slope, -0.5, 0.15) << "causal " << causal << ", errors " << errors[0] << " .. " << errors.back();
  }
}

TEST(RandMultiHeadAttention, DropoutDropsKeysInTrainingOnlyAndKeepsTheExpectation) {
  const Sizes s{2, 9, 9, 8, 2, 16};
  torch::manual_seed(3);
  RandMultiHeadAttention layer(RandMultiHeadAttentionOptions(s.embed_dim, s.heads, s.features).dropout(0.5));
  layer->to(torch::kDouble);
  const torch::Tensor x = torch::randn({s.batch, s.queries, s.embed_dim}, torch::kDouble);
  torch::NoGradGuard no_grad;
  const torch::Tensor undropped = reference_of(layer, x, x, x, weights_of(layer));
  layer->eval();
  EXPECT_LE(reference::relative_error(layer(x, x, x), undropped), 1e-12) << "eval applies no dropout";
  layer->train();
  const torch::Tensor one = layer(x, x, x);
  EXPECT_FALSE(torch::allclose(one, layer(x, x, x))) << "two training calls draw different keys";
  torch::Tensor mean = torch::zeros_like(one);
  const int draws = 400;
  for (int i = 0; i < draws; ++i) mean += layer(x, x, x) / draws;
  const double single_error = reference::relative_error(one, undropped);
  EXPECT_LT(reference::relative_error(mean, undropped), single_error / 5) << "the mean of draws estimates the "
                                                                             "undropped output";
  // Each draw is the definition with a key's value scaled by 0 or 2 in the numerator.
  torch::manual_seed(8);
  const torch::Tensor drawn = layer(x, x, x);
  torch::manual_seed(8);
  const torch::Tensor factors =
      torch::empty({s.batch, s.keys, s.heads}, torch::kDouble).bernoulli_(0.5).div_(0.5);
  EXPECT_LE(reference::relative_error(drawn, reference_of(layer, x, x, x, weights_of(layer), {}, {}, factors)), 1e-12);
}

TEST(RandMultiHeadAttention, PaddingMasksZeroTheMaskedRowsAndColumns) {
  torch::manual_seed(4);
  RandMultiHeadAttention layer = double_layer({2, 7, 7, 8, 2, 8}, FeatureKernel::softmax, false, true);
  const torch::Tensor x = torch::randn({2, 7, 8}, torch::kDouble);
  torch::Tensor keep_queries = torch::ones({2, 7}, torch::kBool), keep_keys = torch::ones({2, 7}, torch::kBool);
  keep_queries[1].narrow(0, 5, 2).fill_(false);
  keep_keys[0].narrow(0, 4, 3).fill_(false);
  keep_keys[1].narrow(0, 0, 1).fill_(false);
  const torch::Tensor mask = keep_queries.unsqueeze(-1).logical_and(keep_keys.unsqueeze(-2));
  torch::NoGradGuard no_grad;
  const torch::Tensor out = layer(x, x, x, mask);
  EXPECT_LE(reference::relative_error(out, reference_of(layer, x, x, x, weights_of(layer), keep_queries, keep_keys)),
            1e-12);
  EXPECT_TRUE(torch::equal(out[1][6], layer->b0)) << "a query that sees no key answers the output bias";
  // Masked keys take no part: the same as the keys left out (but for the keys' stabiliser, which
  // cancels up to the 1e-5 added to every feature).
  const torch::Tensor kept_keys = x[0].narrow(0, 0, 4).unsqueeze(0);
  EXPECT_LE(reference::relative_error(out[0], layer(x[0].unsqueeze(0), kept_keys, kept_keys)[0]), 1e-3);
  torch::Tensor pairwise = mask.clone();
  pairwise[0][0][0] = false;
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { layer(x, x, x, pairwise); }), "attention_mask"));
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { layer(x, x, x, mask.to(torch::kFloat)); }), "bool"));
}

TEST(RandMultiHeadAttention, Bfloat16StaysWithinItsPrecisionOfTheDouble) {
  // bf16 keeps 8 bits: the features' exponentials and two contractions over 64 positions lose a
  // few of them; 3% of the output's norm is the bound.
  torch::manual_seed(5);
  for (const bool causal : {false, true}) {
    RandMultiHeadAttention layer(RandMultiHeadAttentionOptions(32, 4, 64).causal(causal));
    const torch::Tensor x = torch::randn({2, 64, 32});
    const auto w = weights_of(layer);
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> in_double;
    for (const auto& t : w) in_double.push_back(t.to(torch::kDouble));
    const torch::Tensor xd = x.to(torch::kDouble);
    const torch::Tensor expected = reference::rand_mha(
        xd, xd, xd, in_double[0], in_double[1], in_double[2], in_double[3], in_double[4], in_double[5], in_double[6],
        in_double[7], layer->projection_matrix.to(torch::kDouble), 4, true, causal);
    layer->to(torch::kBFloat16);
    const torch::Tensor out = layer(x.to(torch::kBFloat16), x.to(torch::kBFloat16), x.to(torch::kBFloat16));
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    EXPECT_LE(reference::relative_error(out, expected), 3e-2) << "causal " << causal;
  }
}

// nn.MultiheadAttention's call (sequence first, its masks) on the layer's tensors: the layer's own
// forward on the batch-first input and the mask it stands for; inputs left as they were.
TEST(RandMultiHeadAttention, MhasCallComputesTheLayersForwardOnItsLayoutAndMasks) {
  torch::manual_seed(6);
  RandMultiHeadAttention layer = double_layer({3, 9, 9, 8, 2, 8}, FeatureKernel::softmax, false, true);
  const torch::Tensor x = torch::randn({9, 3, 8}, torch::kDouble);  // [L, N, E]
  const torch::Tensor x_before = x.clone();
  auto call = [&](const c10::optional<torch::Tensor>& padding, const c10::optional<torch::Tensor>& attn_mask,
                  const torch::Tensor& input) {
    return rand_multihead_attention_with_mha_masks(input, input, input, padding, attn_mask, /*batch_first=*/false,
                                                   layer->Wq, layer->Wk, layer->Wv, layer->W0, layer->bq, layer->bk,
                                                   layer->bv, layer->b0, layer->projection_matrix, 2,
                                                   FeatureKernel::softmax, 0.0, false);
  };
  torch::NoGradGuard no_grad;
  const torch::Tensor batch_first = x.transpose(0, 1);
  EXPECT_TRUE(torch::equal(call({}, {}, x), layer(batch_first, batch_first, batch_first).transpose(0, 1)));
  // generate_square_subsequent_mask's float mask, and the bool one, make the call causal.
  const torch::Tensor later = torch::ones({9, 9}, torch::kBool).triu(1);
  const torch::Tensor causal_out =
      rand_multihead_attention(batch_first, batch_first, batch_first, layer->Wq, layer->Wk, layer->Wv, layer->W0,
                               layer->bq, layer->bk, layer->bv, layer->b0, layer->projection_matrix, 2,
                               FeatureKernel::softmax, /*causal=*/true, 0.0, false)
          .transpose(0, 1);
  EXPECT_TRUE(torch::equal(call({}, later, x), causal_out));
  EXPECT_TRUE(torch::equal(call({}, torch::zeros({9, 9}, torch::kDouble).masked_fill(later, -INFINITY), x), causal_out));
  // key_padding_mask (true = ignored) is the layer's mask keeping the other keys; per head alike.
  torch::Tensor padding = torch::zeros({3, 9}, torch::kBool);
  padding[1].narrow(0, 6, 3).fill_(true);
  const torch::Tensor allowed = padding.logical_not().unsqueeze(1).expand({3, 9, 9});
  const torch::Tensor padded = layer(batch_first, batch_first, batch_first, allowed).transpose(0, 1);
  EXPECT_TRUE(torch::equal(call(padding, {}, x), padded));
  const torch::Tensor per_head = allowed.logical_not().repeat_interleave(2, 0);  // [N * heads, L, S]
  EXPECT_TRUE(torch::equal(call({}, per_head, x), padded));
  // Unbatched: one sequence [L, E] (its GEMMs of other sizes may round otherwise).
  EXPECT_LE(reference::relative_error(call({}, {}, x.select(1, 0)), call({}, {}, x).select(1, 0)), 1e-12);
  EXPECT_TRUE(torch::equal(x, x_before));

  auto message = [&](const c10::optional<torch::Tensor>& padding_mask, const c10::optional<torch::Tensor>& attn_mask) {
    return testing::error_message<UsageError>([&] { call(padding_mask, attn_mask, x); });
  };
  EXPECT_TRUE(testing::Contains(message(torch::full({3, 9}, -2.0, torch::kDouble), {}),
                                "key_padding_mask: holds values other than 0 and -inf"));
  torch::Tensor differs = per_head.clone();
  differs[0][0][0] = true;
  EXPECT_TRUE(testing::Contains(message({}, differs), "attn_mask: differs between heads"));
  EXPECT_TRUE(testing::Contains(message({}, torch::zeros({4, 9}, torch::kBool)), "attn_mask: expected [9, 9] or [6, 9, 9]"));
  EXPECT_TRUE(testing::Contains(message(torch::zeros({3, 8}, torch::kBool), {}), "key_padding_mask: expected [3, 9]"));
}

TEST(RandMultiHeadAttention, ErrorsNameTheArgument) {
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { RandMultiHeadAttention(RandMultiHeadAttentionOptions(10, 3, 8)); }), "num_heads"));
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { RandMultiHeadAttention(RandMultiHeadAttentionOptions(8, 2, 0)); }),
                       "num_random_features"));
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { RandMultiHeadAttention(RandMultiHeadAttentionOptions(8, 2, 4).dropout(1.0)); }),
                       "dropout"));
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { parse_feature_kernel("gelu"); }), "kernel_fn"));
  RandMultiHeadAttention layer(RandMultiHeadAttentionOptions(8, 2, 4));
  const torch::Tensor x = torch::randn({2, 5, 8});
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { layer(torch::randn({5, 8}), x, x); }), "query"));
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { layer(x, torch::randn({3, 5, 8}), x); }), "key"));
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { layer(x, x, torch::randn({2, 4, 8})); }), "value"));
  RandMultiHeadAttention causal(RandMultiHeadAttentionOptions(8, 2, 4).causal(true));
  EXPECT_TRUE(testing::Contains(testing::error_message<UsageError>([&] { causal(x, torch::randn({2, 6, 8}), torch::randn({2, 6, 8})); }),
                       "as many keys as queries"));
}

}  // namespace
}  // namespace afterburner::sketch
