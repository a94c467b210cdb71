// Activation checkpointing: a wrapped sub-module keeps no activations from its forward pass;
// backward recomputes them (same RNG and autocast state), trading compute for memory.
//
//   auto model = afterburner::models::make_model("resnet");
//   afterburner::train::checkpoint_layers(model, {3, 4, 5});   // the three residual blocks
//   auto loss = model->forward(x).sum();
//   loss.backward();   // gradients equal the plain model's
#pragma once

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <vector>

namespace afterburner::train {

class CheckpointedImpl : public torch::nn::Module {
 public:
  // `inner` must map one tensor to one tensor.
  explicit CheckpointedImpl(torch::nn::AnyModule inner);
  torch::Tensor forward(const torch::Tensor& x);
  // The plain forward of the wrapped module, with activations kept.
  torch::Tensor forward_inner(const torch::Tensor& x);

 private:
  torch::nn::AnyModule inner_;
};
TORCH_MODULE(Checkpointed);

// Wraps the layers of `model` at these indices in Checkpointed, in place. Parameters keep
// their values (the same tensors), under the names "<index>.inner.<name>".
// Throws UsageError for an index out of range.
void checkpoint_layers(torch::nn::Sequential& model, const std::vector<int64_t>& indices);

}  // namespace afterburner::train
