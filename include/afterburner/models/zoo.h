// The model zoo: models by name, as torch::nn::Sequential so that later passes (fusion,
// sketching, checkpointing) can rewrite them layer by layer.
//
//   auto model = afterburner::models::make_model("cnn");          // Fashion-MNIST sized
//   auto logits = model->forward(torch::randn({8, 1, 28, 28}));   // [8, 10]
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/arg.h>

#include <string>
#include <vector>

#include "afterburner/models/residual.h"

namespace afterburner::models {

struct ModelOptions {
  TORCH_ARG(int64_t, in_channels) = 1;
  TORCH_ARG(int64_t, image_size) = 28;
  TORCH_ARG(int64_t, num_classes) = 10;
  TORCH_ARG(BatchNorm2dFactory, batch_norm) = batch_norm_2d;
  TORCH_ARG(int64_t, attention_features) = 32;  // m per head, for the performer
};

// "mlp" (flatten - 1024 - ReLU - 1024 - ReLU - classes), "cnn" (conv3x3 32 - ReLU - maxpool2 -
// conv3x3 64 - ReLU - maxpool2 - fc 128 - ReLU - fc classes), "resnet" (a small ResNet:
// 3 stages of basic blocks, 32/64/128 channels), "performer" (each pixel row a token: linear to
// 64, a learned position embedding, 2 pre-norm blocks of random-feature attention with 4 heads
// and an MLP of 256, LayerNorm, the tokens' mean, fc classes; models/performer.h). Throws
// UsageError for an unknown name.
torch::nn::Sequential make_model(const std::string& name, const ModelOptions& options = {});

const std::vector<std::string>& model_names();

}  // namespace afterburner::models
