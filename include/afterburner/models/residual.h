// A ResNet basic block: two 3x3 conv + BatchNorm, with a 1x1 projection on the skip path
// when the shape changes.
//
//   afterburner::models::BasicBlock block(32, 64, /*stride=*/2);
//   auto y = block->forward(torch::randn({4, 32, 28, 28}));   // [4, 64, 14, 14]
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include <functional>

namespace afterburner::models {

// Builds a 2-d batch normalisation layer of `channels`: BatchNorm2d, or in data-parallel
// training one that normalises over all ranks' batches (dist::SyncBatchNorm2d, a BatchNorm2d too).
using BatchNorm2dFactory = std::function<torch::nn::AnyModule(int64_t channels)>;
torch::nn::AnyModule batch_norm_2d(int64_t channels);

class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride = 1,
                 const BatchNorm2dFactory& batch_norm = batch_norm_2d);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::AnyModule bn1, bn2;
  torch::nn::Sequential shortcut{nullptr};  // empty when the skip path is the identity
};
TORCH_MODULE(BasicBlock);

}  // namespace afterburner::models
