// Any model the Trainer can train: a torch::nn::Module whose forward takes one Tensor and
// returns one (a Sequential, your own TORCH_MODULE, ...) or a TorchScript module written in
// Python, scripted or traced, whose forward does the same. Either is trained in place.
//
//   train::Model zoo = models::make_model("cnn");                     // any module holder
//   train::Model mine(infer::load_model("my_model.pt"));              // torch.jit.save'd in Python
//   torch::Tensor logits = mine.forward(images);
//   for (auto& p : mine.parameters()) ...                            // what an optimizer steps
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace afterburner::train {

// One level of a model's state, in torch::nn::Module::save's layout: its own parameters and
// buffers by name, then its children's.
struct StateTree {
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  std::vector<std::pair<std::string, StateTree>> children;
};

class Model {
 public:
  // A module holder (torch::nn::Sequential, Linear, a TORCH_MODULE of your own) whose module
  // has forward(const Tensor&) -> Tensor.
  template <typename Contained>
  /* implicit */ Model(const torch::nn::ModuleHolder<Contained>& holder)
      : module_(holder.ptr()),
        forward_([module = holder.ptr().get()](const torch::Tensor& x) { return module->forward(x); }) {}
  // A TorchScript module; its forward must take one Tensor and return one. `forward`, when given,
  // runs instead of it on the module (kernels::fuse_forward's fused copy).
  /* implicit */ Model(torch::jit::Module script, std::shared_ptr<torch::jit::Function> forward = nullptr);

  // Throws UsageError when a TorchScript forward returns something else than one Tensor.
  torch::Tensor forward(const torch::Tensor& input) const;

  // Each parameter once (a weight tied between layers, too), in the module's order.
  std::vector<torch::Tensor> parameters() const;
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;  // dotted names, the first of each
  std::vector<torch::Tensor> buffers() const;
  StateTree state() const;

  void train(bool on = true);
  bool is_training() const;
  // Drops every gradient (the next backward allocates them anew).
  void zero_grad();
  void to(torch::Device device);

  // The torch::nn::Module, or nullptr for a TorchScript module.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  // The TorchScript module, or nullptr.
  const std::shared_ptr<torch::jit::Module>& script() const { return script_; }
  // The graph forward() runs on script(): the fused copy's when one was given; nullptr for a
  // module holder.
  std::shared_ptr<torch::jit::Graph> forward_graph() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
  std::shared_ptr<torch::jit::Module> script_;
  std::shared_ptr<torch::jit::Function> script_forward_;
};

}  // namespace afterburner::train
