#include "afterburner/models/performer.h"

#include <fmt/format.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

#include "afterburner/core/error.h"
#include "afterburner/kernels/gelu.h"
#include "afterburner/kernels/layer_norm.h"
#include "afterburner/kernels/linear_relu.h"

namespace afterburner::models {

PerformerBlockImpl::PerformerBlockImpl(const PerformerBlockOptions& options) : options(options) { reset(); }

void PerformerBlockImpl::reset() {
  const int64_t e = options.embed_dim();
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({e})));
  attention = register_module(
      "attention", sketch::RandMultiHeadAttention(
                       sketch::RandMultiHeadAttentionOptions(e, options.num_heads(), options.num_random_features())
                           .kernel(options.kernel())));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({e})));
  fc1 = register_module("fc1", torch::nn::Linear(e, options.hidden()));
  fc2 = register_module("fc2", torch::nn::Linear(options.hidden(), e));
}

// On afterburner's kernels (the layers hold the parameters): fp32 products on oneDNN in the
// OpenMP pool rather than on OpenBLAS's competing one (kernels/gemm.h), LayerNorm and GELU's
// gradient in one pass each. Under autocast LayerNorm's result is bf16 where a Linear reads it.
torch::Tensor PerformerBlockImpl::forward(const torch::Tensor& x) {
  const auto norm = [](const torch::nn::LayerNorm& ln, const torch::Tensor& t) {
    return kernels::layer_norm(t, ln->options.normalized_shape(), ln->weight, ln->bias, ln->options.eps(),
                               /*bf16_for_autocast=*/true);
  };
  const torch::Tensor normed = norm(ln1, x);
  const torch::Tensor h = x + attention(normed, normed, normed);
  const torch::Tensor hidden = kernels::gelu(kernels::linear(norm(ln2, h), fc1->weight, fc1->bias));
  return h + kernels::linear(hidden, fc2->weight, fc2->bias);
}

torch::Tensor ImageRowsImpl::forward(const torch::Tensor& images) {
  if (images.dim() != 4) {
    throw UsageError("ImageRows input", fmt::format("expected images [B, C, H, W], got {}", c10::str(images.sizes())));
  }
  return images.permute({0, 2, 1, 3}).flatten(2);
}

std::string ImageRowsImpl::torchscript_forward() const { return "x.permute([0, 2, 1, 3]).flatten(2)"; }

PositionEmbeddingImpl::PositionEmbeddingImpl(int64_t positions, int64_t embed_dim)
    : positions(positions), embed_dim(embed_dim) {
  reset();
}

void PositionEmbeddingImpl::reset() {
  position = register_parameter("position", torch::empty({positions, embed_dim}));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(position, 0.0, 0.02);
}

torch::Tensor PositionEmbeddingImpl::forward(const torch::Tensor& x) {
  if (x.dim() != 3 || x.size(1) != positions || x.size(2) != embed_dim) {
    throw UsageError("PositionEmbedding input",
                     fmt::format("expected [B, {}, {}], got {}", positions, embed_dim, c10::str(x.sizes())));
  }
  return x + position;
}

}  // namespace afterburner::models
