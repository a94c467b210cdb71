// TorchScript export of a Sequential model, in inference form (BatchNorm uses its running
// statistics), loadable by Python's torch.jit.load and by torch::jit::load.
//
//   auto model = afterburner::models::make_model("cnn");
//   afterburner::models::export_torchscript(model, "cnn.pt");
//   // Python: torch.jit.load("cnn.pt")(torch.randn(1, 1, 28, 28))
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <unordered_map>

namespace afterburner::models {

// A layer defined outside this area that says how it exports: the TorchScript expression of its
// forward in inference, over `x` and its parameters and buffers as `self.` attributes.
class SelfExportingLayer {
 public:
  virtual ~SelfExportingLayer() = default;
  virtual std::string torchscript_kind() const = 0;  // the exported module's class name
  virtual std::string torchscript_forward() const = 0;
};

// BatchNorm's inference forward (running statistics), for layers that export as BatchNorm2d.
std::string batch_norm_torchscript(double eps);

// Layers supported: Conv2d, Linear, BatchNorm2d, LayerNorm, ReLU, MaxPool2d, AdaptiveAvgPool2d,
// Flatten, Dropout (dropped), BasicBlock, PerformerBlock, nested Sequential, the sketched SKLinear
// and SKConv2d (as sketch::script_layer writes them) and any SelfExportingLayer. Any other layer throws an Error
// naming it.
// Parameters keep their names (weight, bias, running_mean, ...); layer i becomes submodule "layer<i>".
// `extra_files` are written into the archive as write_file_atomically writes them.
void export_torchscript(const torch::nn::Sequential& model, const std::string& path,
                        const std::unordered_map<std::string, std::string>& extra_files = {});

}  // namespace afterburner::models
