// The zoo's performer pieces: a block's forward is its definition (pre-norm, random-feature
// attention, GELU MLP) computed from its own layers in double; every parameter of the model gets
// a gradient and the model fits a batch; the token and position layers refuse other shapes by name.
#include "afterburner/models/performer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/models/zoo.h"
#include "testing.h"

namespace afterburner::models {
namespace {

TEST(PerformerBlock, ComputesItsDefinitionInDouble) {
  torch::manual_seed(1);
  PerformerBlock block(PerformerBlockOptions(16, 2, 8).hidden(24));
  block->to(torch::kDouble);
  const torch::Tensor x = torch::randn({3, 5, 16}, torch::kDouble);
  namespace F = torch::nn::functional;
  auto norm = [](const torch::Tensor& t, const torch::nn::LayerNorm& ln) {
    return torch::layer_norm(t, {t.size(-1)}, ln->weight, ln->bias, ln->options.eps());
  };
  const auto& a = block->attention;
  const torch::Tensor normed = norm(x, block->ln1);
  const torch::Tensor h =
      x + sketch::rand_multihead_attention(normed, normed, normed, a->Wq, a->Wk, a->Wv, a->W0, a->bq, a->bk, a->bv,
                                           a->b0, a->projection_matrix, 2, sketch::FeatureKernel::softmax, false, 0.0,
                                           false);
  const torch::Tensor expected =
      h + F::linear(torch::gelu(F::linear(norm(h, block->ln2), block->fc1->weight, block->fc1->bias)),
                    block->fc2->weight, block->fc2->bias);
  for (int call = 0; call < 2; ++call) EXPECT_TRUE(torch::allclose(block(x), expected, 1e-12, 1e-12));
}

TEST(Performer, EveryParameterLearnsAndTheModelFitsABatch) {
  torch::manual_seed(2);
  auto model = make_model("performer");
  const torch::Tensor x = torch::randn({32, 1, 28, 28});
  const torch::Tensor y = torch::randint(0, 10, {32});
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(3e-3));
  auto loss = [&] { return torch::cross_entropy_loss(model->forward(x), y); };
  const torch::Tensor first = loss();
  first.backward();
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(p.value().grad().defined() && p.value().grad().abs().sum().item<double>() > 0) << p.key();
  }
  for (int step = 0; step < 40; ++step) {
    adam.zero_grad();
    loss().backward();
    adam.step();
  }
  EXPECT_LT(loss().item<double>(), 0.5 * first.item<double>());
}

TEST(Performer, TokensAndPositionsRefuseOtherShapesByName) {
  using testing::Contains;
  using testing::error_message;
  EXPECT_TRUE(Contains(error_message<UsageError>([] { ImageRows()(torch::randn({2, 28, 28})); }),
                       "ImageRows input: expected images [B, C, H, W], got [2, 28, 28]"));
  EXPECT_TRUE(Contains(error_message<UsageError>([] { PositionEmbedding(28, 64)(torch::randn({2, 27, 64})); }),
                       "PositionEmbedding input: expected [B, 28, 64], got [2, 27, 64]"));
}

}  // namespace
}  // namespace afterburner::models
