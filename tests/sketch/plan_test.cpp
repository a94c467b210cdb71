// plan_layer: the rank each layer gets and the weights its sketch trains, by the shapes of
// SKLinear (Lk(d_in + d_out)) and SKConv2d (2Lk C_in Kh Kw), and when a sketch saves nothing.
#include "afterburner/sketch/plan.h"

#include <gtest/gtest.h>

#include "afterburner/core/error.h"
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
  EXPECT_EQ(describe(plan), "fc (Linear [1024, 784]): 2 terms of rank 16, 58880 of 803840 parameters");
  EXPECT_EQ(describe(plan_layer(SketchConfig().rank(16), "fc", LayerKind::linear, {1024, 784}, true)),
            "fc (Linear [1024, 784]): rank 16, 29952 of 803840 parameters");

  auto conv = plan_layer(SketchConfig().rank(4), "conv", LayerKind::conv2d, {64, 32, 3, 3}, false);
  EXPECT_EQ(conv.sketched_params, 2 * 4 * 32 * 9);
  EXPECT_EQ(conv.dense_params, 64 * 32 * 9);
}

TEST(SketchPlan, PerLayerSketchesOverrideTheModelWideOne) {
  const SketchConfig config = SketchConfig().terms(1).rank(64).layers({{"fc1", {2, 8}}, {"fc2", {1, 0}}});
  const LayerPlan own = plan_layer(config, "fc1", LayerKind::linear, {1024, 784}, true);
  EXPECT_EQ(own.terms, 2);
  EXPECT_EQ(own.rank, 8);
  EXPECT_EQ(own.sketched_params, 2 * 8 * (784 + 1024) + 1024);
  EXPECT_EQ(plan_layer(config, "fc2", LayerKind::linear, {1024, 1024}, true).kept_because, "kept by the per-layer plan");
  const LayerPlan other = plan_layer(config, "fc3", LayerKind::linear, {1024, 1024}, true);
  EXPECT_EQ(other.terms, 1);
  EXPECT_EQ(other.rank, 64);
  // A layer named alone, the others kept: no model-wide rank or budget needed.
  const SketchConfig alone = SketchConfig().attention_features(16).layers({{"fc1", {1, 32}}});
  EXPECT_EQ(plan_layer(alone, "fc1", LayerKind::linear, {1024, 784}, true).rank, 32);
  EXPECT_FALSE(plan_layer(alone, "fc3", LayerKind::linear, {1024, 784}, true).replaced());
  // The per-layer sketch still has to cost less than the layer.
  EXPECT_TRUE(Contains(plan_layer(SketchConfig(config).layers({{"head", {2, 8}}}), "head", LayerKind::linear, {10, 128}, true)
                           .kept_because,
                       "would not save"));
  EXPECT_THROW(check_config(SketchConfig().rank(8).layers({{"fc1", {0, 8}}})), UsageError);
  EXPECT_NO_THROW(check_config(SketchConfig().layers({{"fc1", {1, 8}}})));  // layers alone, no model-wide rank
  // Attention layers take m of their own, or are kept; the others take the model-wide m.
  const SketchConfig attention = SketchConfig().attention_features(64).layers({{"a", {1, 0, 16}}, {"b", {1, 0, 0}}});
  EXPECT_EQ(plan_attention(attention, "a", 32, 4, true).random_features, 16);
  EXPECT_EQ(plan_attention(attention, "b", 32, 4, true).kept_because, "kept by the per-layer plan");
  EXPECT_EQ(plan_attention(attention, "c", 32, 4, true).random_features, 64);
  EXPECT_EQ(plan_attention(SketchConfig().rank(8).layers({{"a", {1, 0, 16}}}), "a", 32, 4, true).random_features, 16);
}

TEST(SketchPlan, LayerSketchesParseAndFormatBothWays) {
  const LayerSketches layers = parse_layer_sketches("fc1=2:32,features.3=keep,,0=1:8,enc.attn=m:64");
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers.at("fc1"), (LayerSketch{2, 32}));
  EXPECT_EQ(layers.at("features.3"), (LayerSketch{1, 0}));
  EXPECT_EQ(layers.at("0"), (LayerSketch{1, 8}));
  EXPECT_EQ(layers.at("enc.attn"), (LayerSketch{1, 0, 64}));
  EXPECT_EQ(format_layer_sketches(layers), "0=1:8,enc.attn=m:64,fc1=2:32,features.3=keep");
  EXPECT_EQ(parse_layer_sketches(format_layer_sketches(layers)), layers);
  EXPECT_TRUE(parse_layer_sketches("").empty());
  for (const char* bad : {"fc1", "=1:8", "fc1=8", "fc1=0:8", "fc1=1:0", "fc1=1:x", "fc1=1:8,fc1=keep", "fc1=1:8:2",
                          "a=m:0", "a=m:", "a=m:8x"}) {
    try {
      parse_layer_sketches(bad, "sketch_layers");
      ADD_FAILURE() << bad << " accepted";
    } catch (const UsageError& e) {
      EXPECT_TRUE(Contains(e.what(), "sketch_layers: ")) << e.what();
    }
  }
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
            "no model-wide rank or budget given");
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
