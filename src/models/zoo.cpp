#include "afterburner/models/zoo.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <functional>
#include <map>

#include "afterburner/core/error.h"
#include "afterburner/models/performer.h"
#include "afterburner/models/residual.h"

namespace afterburner::models {
namespace nn = torch::nn;
namespace {

nn::Sequential mlp(const ModelOptions& o) {
  int64_t inputs = o.in_channels() * o.image_size() * o.image_size();
  return nn::Sequential(nn::Flatten(), nn::Linear(inputs, 1024), nn::ReLU(),
                        nn::Linear(1024, 1024), nn::ReLU(), nn::Linear(1024, o.num_classes()));
}

nn::Sequential cnn(const ModelOptions& o) {
  int64_t side = o.image_size() / 4;
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(o.in_channels(), 32, 3).padding(1)), nn::ReLU(),
      nn::MaxPool2d(nn::MaxPool2dOptions(2)),
      nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), nn::ReLU(),
      nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Flatten(),
      nn::Linear(64 * side * side, 128), nn::ReLU(), nn::Linear(128, o.num_classes()));
}

nn::Sequential resnet(const ModelOptions& o) {
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(o.in_channels(), 32, 3).padding(1).bias(false)));
  model->push_back(o.batch_norm()(32));
  model->push_back(nn::ReLU());
  model->push_back(BasicBlock(32, 32, 1, o.batch_norm()));
  model->push_back(BasicBlock(32, 64, 2, o.batch_norm()));
  model->push_back(BasicBlock(64, 128, 2, o.batch_norm()));
  model->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
  model->push_back(nn::Flatten());
  model->push_back(nn::Linear(128, o.num_classes()));
  return model;
}

// Each pixel row a token of embed 64, two blocks of 4 heads, random-feature attention.
nn::Sequential performer(const ModelOptions& o) {
  constexpr int64_t kEmbed = 64, kHeads = 4, kBlocks = 2;
  nn::Sequential model(ImageRows(), nn::Linear(o.in_channels() * o.image_size(), kEmbed),
                       PositionEmbedding(o.image_size(), kEmbed));
  for (int64_t i = 0; i < kBlocks; ++i) {
    model->push_back(PerformerBlock(PerformerBlockOptions(kEmbed, kHeads, o.attention_features())));
  }
  model->push_back(nn::LayerNorm(nn::LayerNormOptions({kEmbed})));
  model->push_back(TokenMean());
  model->push_back(nn::Linear(kEmbed, o.num_classes()));
  return model;
}

using Factory = std::function<nn::Sequential(const ModelOptions&)>;

const std::map<std::string, Factory>& factories() {
  static const std::map<std::string, Factory> table{
      {"mlp", mlp}, {"cnn", cnn}, {"resnet", resnet}, {"performer", performer}};
  return table;
}

}  // namespace

torch::nn::Sequential make_model(const std::string& name, const ModelOptions& options) {
  auto it = factories().find(name);
  if (it == factories().end()) {
    std::string known;
    for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
    throw UsageError("--model", "unknown model '" + name + "' (known: " + known + ")");
  }
  return it->second(options);
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& [name, factory] : factories()) all.push_back(name);
    return all;
  }();
  return names;
}

}  // namespace afterburner::models
