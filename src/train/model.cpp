#include "afterburner/train/model.h"

#include <torch/csrc/jit/runtime/graph_executor.h>

#include <unordered_set>

#include "afterburner/core/error.h"

namespace afterburner::train {
namespace {

// TorchScript's executor profiles a function's first call (getNumProfiledRuns(): 1) and runs
// later ones on a plan optimized from that profile, whose derivatives round unlike the
// profiled run's: a run resumed in a new process took its first step unlike the uninterrupted
// run (which had profiled at step 1) and drifted. Without profiling every call, the first
// included, runs the same plan, with the executor's autocast pass (LayerNorm needs it under
// bf16: LibTorch 1.13's eager CPU autocast hands it bfloat16 inputs and float32 weights). The
// count is read when a function first runs.
class WithoutProfiledRuns {
 public:
  WithoutProfiledRuns() : previous_(torch::jit::getNumProfiledRuns().exchange(0)) {}
  ~WithoutProfiledRuns() { torch::jit::getNumProfiledRuns() = previous_; }
  WithoutProfiledRuns(const WithoutProfiledRuns&) = delete;
  WithoutProfiledRuns& operator=(const WithoutProfiledRuns&) = delete;

 private:
  size_t previous_;
};

template <typename Named>
std::vector<std::pair<std::string, torch::Tensor>> pairs(const Named& named) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : named) out.emplace_back(item.name, item.value);
  return out;
}

StateTree script_state(const torch::jit::Module& module) {
  StateTree tree{pairs(module.named_parameters(/*recurse=*/false)), pairs(module.named_buffers(/*recurse=*/false)), {}};
  for (const auto& child : module.named_children()) tree.children.emplace_back(child.name, script_state(child.value));
  return tree;
}

// As torch::nn::Module::save walks it.
StateTree module_state(const torch::nn::Module& module) {
  StateTree tree;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) tree.parameters.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/false)) tree.buffers.emplace_back(item.key(), item.value());
  for (const auto& child : module.named_children()) {
    if (child.value()->is_serializable()) tree.children.emplace_back(child.key(), module_state(*child.value()));
  }
  return tree;
}

}  // namespace

Model::Model(torch::jit::Module script, std::shared_ptr<torch::jit::Function> forward)
    : script_(std::make_shared<torch::jit::Module>(std::move(script))), script_forward_(std::move(forward)) {}

torch::Tensor Model::forward(const torch::Tensor& input) const {
  if (!script_) return forward_(input);
  const WithoutProfiledRuns same_plan_from_the_first_call;
  c10::IValue output = script_forward_ ? (*script_forward_)({script_->_ivalue(), input}) : script_->forward({input});
  if (!output.isTensor()) {
    throw UsageError("model", "its forward returns " + output.tagKind() + ", expected one Tensor of logits");
  }
  return output.toTensor();
}

std::shared_ptr<torch::jit::Graph> Model::forward_graph() const {
  if (!script_) return nullptr;
  return script_forward_ ? torch::jit::toGraphFunction(*script_forward_).graph()
                         : script_->get_method("forward").graph();
}

std::vector<torch::Tensor> Model::parameters() const {
  std::vector<torch::Tensor> out;
  for (auto& [name, parameter] : named_parameters()) out.push_back(std::move(parameter));
  return out;
}

// Each parameter once, by its first name, as torch.nn.Module.named_parameters() lists them: a
// weight tied between two layers is one tensor to step (LibTorch's own lists repeat it).
std::vector<std::pair<std::string, torch::Tensor>> Model::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> all;
  if (script_) {
    all = pairs(script_->named_parameters());
  } else {
    for (const auto& item : module_->named_parameters()) all.emplace_back(item.key(), item.value());
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (auto& item : all) {
    if (seen.insert(item.second.unsafeGetTensorImpl()).second) out.push_back(std::move(item));
  }
  return out;
}

std::vector<torch::Tensor> Model::buffers() const {
  if (!script_) return module_->buffers();
  std::vector<torch::Tensor> out;
  for (const auto& buffer : script_->buffers()) out.push_back(buffer);
  return out;
}

StateTree Model::state() const { return script_ ? script_state(*script_) : module_state(*module_); }

void Model::train(bool on) {
  if (script_) {
    script_->train(on);
  } else {
    module_->train(on);
  }
}

bool Model::is_training() const { return script_ ? script_->is_training() : module_->is_training(); }

void Model::zero_grad() {
  for (auto& parameter : parameters()) parameter.mutable_grad().reset();
}

void Model::to(torch::Device device) {
  if (script_) {
    script_->to(device);
  } else {
    module_->to(device);
  }
}

}  // namespace afterburner::train
