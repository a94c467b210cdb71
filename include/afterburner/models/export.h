// TorchScript export of a Sequential model, in inference form (BatchNorm uses its running
// statistics), loadable by Python's torch.jit.load and by torch::jit::load.
//
//   auto model = afterburner::models::make_model("cnn");
//   afterburner::models::export_torchscript(model, "cnn.pt");
//   // Python: torch.jit.load("cnn.pt")(torch.randn(1, 1, 28, 28))
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <string>

namespace afterburner::models {

// Layers supported: Conv2d, Linear, BatchNorm2d, ReLU, MaxPool2d, AdaptiveAvgPool2d, Flatten,
// Dropout (dropped), BasicBlock, nested Sequential, and the sketched SKLinear and SKConv2d
// (as sketch::script_layer writes them). Any other layer throws an Error naming it.
// Parameters keep their names (weight, bias, running_mean, ...); layer i becomes submodule "layer<i>".
void export_torchscript(const torch::nn::Sequential& model, const std::string& path);

}  // namespace afterburner::models
