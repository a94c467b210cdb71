// The zoo's "performer": images read as sequences of tokens (one per pixel row) through pre-norm
// transformer blocks whose attention is random-feature attention (sketch::RandMultiHeadAttention,
// Performer's FAVOR+), linear in the sequence length. Its pieces are modules of their own, so a
// Sequential holds them and the zoo's passes (training, checkpoints, export) see them.
//
//   namespace models = afterburner::models;
//   models::PerformerBlock block(models::PerformerBlockOptions(64, 4, 32));
//   torch::Tensor y = block(torch::randn({8, 28, 64}));          // [8, 28, 64]
//   auto model = models::make_model("performer");                 // 28 tokens of 28 pixels
#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <string>

#include "afterburner/models/export.h"
#include "afterburner/sketch/rand_attention.h"

namespace afterburner::models {

struct PerformerBlockOptions {
  PerformerBlockOptions(int64_t embed_dim, int64_t num_heads, int64_t num_random_features)
      : embed_dim_(embed_dim), num_heads_(num_heads), num_random_features_(num_random_features),
        hidden_(4 * embed_dim) {}
  TORCH_ARG(int64_t, embed_dim);            // E
  TORCH_ARG(int64_t, num_heads);            // H, dividing E
  TORCH_ARG(int64_t, num_random_features);  // m, per head
  TORCH_ARG(int64_t, hidden);               // the MLP's width, 4E unless set
  TORCH_ARG(sketch::FeatureKernel, kernel) = sketch::FeatureKernel::softmax;
};

// y = h + fc2(gelu(fc1(ln2(h)))) with h = x + attention(ln1(x)), for x [B, L, E]: the pre-norm
// block of ViT and GPT-2, attention by random features.
class PerformerBlockImpl : public torch::nn::Cloneable<PerformerBlockImpl> {
 public:
  explicit PerformerBlockImpl(const PerformerBlockOptions& options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

  PerformerBlockOptions options;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  sketch::RandMultiHeadAttention attention{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(PerformerBlock);

// [B, C, H, W] -> [B, H, C W]: each pixel row (all channels) one token.
class ImageRowsImpl : public torch::nn::Cloneable<ImageRowsImpl>, public SelfExportingLayer {
 public:
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& images);
  std::string torchscript_kind() const override { return "ImageRows"; }
  std::string torchscript_forward() const override;
};
TORCH_MODULE(ImageRows);

// x + position for x [B, L, E]: a learned embedding per position, drawn N(0, 0.02^2) as ViT's.
class PositionEmbeddingImpl : public torch::nn::Cloneable<PositionEmbeddingImpl>, public SelfExportingLayer {
 public:
  PositionEmbeddingImpl(int64_t positions, int64_t embed_dim);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  std::string torchscript_kind() const override { return "PositionEmbedding"; }
  std::string torchscript_forward() const override { return "x + self.position"; }

  int64_t positions, embed_dim;
  torch::Tensor position;  // [L, E]
};
TORCH_MODULE(PositionEmbedding);

// [B, L, E] -> [B, E]: the mean over the tokens.
class TokenMeanImpl : public torch::nn::Cloneable<TokenMeanImpl>, public SelfExportingLayer {
 public:
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) { return x.mean(1); }
  std::string torchscript_kind() const override { return "TokenMean"; }
  std::string torchscript_forward() const override { return "x.mean(1)"; }
};
TORCH_MODULE(TokenMean);

}  // namespace afterburner::models
