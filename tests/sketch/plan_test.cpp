// plan_layer: the rank each layer gets and the weights its sketch trains, by the shapes of
// SKLinear (Lk(d_in + d_out)) and SKConv2d (2Lk C_in Kh Kw), and when a sketch saves nothing.
#include "afterburner/sketch/plan.h"

#include <gtest/gtest.h>

#include "testing.h"

namespace afterburner::sketch {
namespace {
using afterburner::testing::Contains;

TEST(SketchPlan, AFixedRankCountsTheSketchedWeights) {
  auto plan = plan_layer(SketchConfig().terms(2).rank(16), "fc", LayerKind::linear, {1024, 784}, true);
  ASSERT_TRUE(plan.replaced());
  EXPECT_EQ(plan.rank, 16);
  EXPECT_EQ(plan.dense_params, 1024 * 784 + 1024);
  EXPECT_EQ(plan.sketched_params, 2 * 16 * (784 + 1024) + 1024);
  EXPECT_EQ(describe(plan), "fc (Linear [1024, 784]): rank 16, 58880 of 803840 parameters");

  auto conv = plan_layer(SketchConfig().rank(4), "conv", LayerKind::conv2d, {64, 32, 3, 3}, false);
  EXPECT_EQ(conv.sketched_params, 2 * 4 * 32 * 9);
  EXPECT_EQ(conv.dense_params, 64 * 32 * 9);
}

TEST(SketchPlan, ABudgetGivesTheLargestRankWithinIt) {
  // L(d_in + d_out) = 2048 weights per unit of rank; a quarter of 1024 x 1024 allows 128.
  auto plan = plan_layer(SketchConfig().budget(0.25), "fc", LayerKind::linear, {1024, 1024}, true);
  EXPECT_EQ(plan.rank, 128);
  auto under = plan_layer(SketchConfig().budget(0.2499), "fc", LayerKind::linear, {1024, 1024}, true);
  EXPECT_EQ(under.rank, 127);
  // 60% of the weights would fit rank 307, whose two GEMMs cost more than the dense one.
  EXPECT_EQ(plan_layer(SketchConfig().budget(0.6), "fc", LayerKind::linear, {1024, 1024}, true).kept_because,
            "rank 307 would not save: 2Lk(d_in + d_out) = 1257472 > d_in d_out = 1048576");
  // SKConv2d: 2L C_in Kh Kw = 576 per unit of rank; half of 64 x 32 x 3 x 3 allows 16.
  EXPECT_EQ(plan_layer(SketchConfig().budget(0.5), "c", LayerKind::conv2d, {64, 32, 3, 3}, true).rank, 16);
}

TEST(SketchPlan, LayersThatWouldNotSaveAreKeptWithTheReason) {
  auto small = plan_layer(SketchConfig().rank(8), "head", LayerKind::linear, {10, 1024}, true);
  EXPECT_FALSE(small.replaced());
  EXPECT_EQ(small.rank, 0);
  EXPECT_EQ(small.sketched_params, small.dense_params);
  EXPECT_EQ(small.kept_because, "rank 8 would not save: 2Lk(d_in + d_out) = 16544 > d_in d_out = 10240");
  EXPECT_TRUE(Contains(describe(small), "head (Linear [10, 1024]) kept: rank 8"));
  auto tiny = plan_layer(SketchConfig().budget(0.01), "head", LayerKind::linear, {10, 1024}, true);
  EXPECT_TRUE(Contains(tiny.kept_because, "a budget of 0.01 allows no rank-1 sketch (1034 weights per unit of rank)"));
  // 2Lk = C_out: no saving for a convolution.
  EXPECT_EQ(plan_layer(SketchConfig().rank(16), "c", LayerKind::conv2d, {32, 3, 3, 3}, true).kept_because,
            "rank 16 would not save: 2Lk = 32 >= C_out = 32");
}

TEST(SketchPlan, AttentionKeepsItsWeightsAndIsReplacedOnlyGivenFeatures) {
  // in_proj [3E, E] + out_proj [E, E] and their biases: the same tensors as Wq, Wk, Wv, W0.
  auto plan = plan_attention(SketchConfig().attention_features(32), "enc.self_attn", 64, 4, true);
  ASSERT_TRUE(plan.replaced());
  EXPECT_EQ(plan.random_features, 32);
  EXPECT_EQ(plan.dense_params, 4 * 64 * 64 + 4 * 64);
  EXPECT_EQ(plan.sketched_params, plan.dense_params);
  EXPECT_EQ(describe(plan), "enc.self_attn (MultiheadAttention, embed_dim 64, 4 heads): 32 random features per head, "
                            "16640 parameters");
  auto exact = plan_attention(SketchConfig().rank(4), "attn", 64, 4, false);
  EXPECT_EQ(exact.kept_because, "exact attention kept (no number of random features given)");
  EXPECT_EQ(exact.dense_params, 4 * 64 * 64);
  auto traced = plan_attention(SketchConfig().attention_features(8), "attn", 16, 0, true, "a traced forward");
  EXPECT_EQ(describe(traced), "attn (MultiheadAttention, embed_dim 16) kept: a traced forward");
  // Features alone: Linear layers are kept, attention replaced.
  EXPECT_EQ(plan_layer(SketchConfig().attention_features(8), "fc", LayerKind::linear, {64, 64}, true).kept_because,
            "no rank or budget given (attention sketched alone)");
  plan.keep("its class is shared");
  EXPECT_FALSE(plan.replaced());
  EXPECT_EQ(plan.random_features, 0);
}

TEST(SketchPlan, TheReportSumsUp) {
  SketchReport report;
  report.layers.push_back(plan_layer(SketchConfig().rank(4), "a", LayerKind::linear, {64, 64}, true));
  report.layers.push_back(plan_layer(SketchConfig().rank(4), "b", LayerKind::linear, {2, 64}, true));
  report.params_before = 1000;
  report.params_after = 400;
  EXPECT_EQ(report.replaced_count(), 1);
  EXPECT_EQ(describe(report), "1000 -> 400 trainable parameters (2.50x fewer), 1 of 2 layers sketched");
}

}  // namespace
}  // namespace afterburner::sketch
