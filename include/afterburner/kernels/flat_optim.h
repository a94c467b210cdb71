// SGD and AdamW that step all parameters of a group in one fused pass over flat buffers.
//
//   afterburner::kernels::FlatSGD optimizer(
//       model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4));
//   for (auto& batch : batches) {
//     optimizer.zero_grad();   // one memset; gradients stay views of the flat gradient buffer
//     criterion(model->forward(batch.input), batch.target).backward();  // accumulates in place
//     optimizer.step();        // one pass over parameters, gradients and state per group
//   }
//
// Both are torch::optim::Optimizer subclasses taking torch's own options, so code holding an
// Optimizer& (param_groups()[g].options().set_lr(), p.grad() walks, save/load) works unchanged.
//
// Layout. Construction moves each group's parameters into one contiguous float32 buffer: every
// parameter's storage becomes a slice of it, keeping its values and its memory layout (a
// channels_last weight keeps its strides; the optimizer state of each slice uses the same
// strides, so the update stays elementwise). The first step does the same for the gradients;
// LibTorch's AccumulateGrad then adds later gradients in place into those slices.
//
// Zeroing. Keep gradients in place between steps: call zero_grad() here (one memset) or
// Optimizer::zero_grad() through an Optimizer& (zeroes each gradient in place). After
// Module::zero_grad(true) backward allocates new gradients, and the next step copies them back
// into the flat buffer inside its pass: bench_flat_optim measured such steps at 1.2x (cnn,
// AdamW) to 2.4x (mlp, SGD) the time of steps with gradients in place. Parameters that left
// their slice (Module::load set_()s them to the loaded tensors) are copied back at the next
// step or load(). Groups added with add_param_group are flattened at the next step.
//
// bf16 copies. bf16_copy(p) gives a bfloat16 leaf for a forward under bf16 autocast to read in p's
// place (train::Bf16Weights swaps them into a TorchScript model): its gradient arrives in bf16 and
// is read as it is, and the step rewrites the copy from the stepped p in the same pass, so neither
// autocast's cast of the weight nor its backward's cast of the gradient runs. Same bits.
//
// Semantics follow torch::optim::SGD / AdamW: a parameter whose gradient is undefined is skipped
// and gets no state; AdamW counts steps per parameter. save()/load() write and read torch's own
// archive format (checkpoints move between FlatSGD and torch::optim::SGD in both directions).
//
// Refused with UsageError: parameters that are not float32 CPU tensors (for bf16 training keep
// fp32 master weights and use autocast, with bf16 copies where they apply), a tensor listed twice, sparse gradients, AdamW's
// amsgrad, and the option values torch rejects.
#pragma once

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace afterburner::kernels {

// Where one chunk of a flat optimizer's update reads its gradient and writes its parameter's bf16
// copy (FlatOptimizer::step_group).
struct FlatChunk {
  const float* grad = nullptr;          // a float32 gradient, or
  const uint16_t* grad_bf16 = nullptr;  // a bf16 copy's gradient (bfloat16 bits)
  uint16_t* copy = nullptr;             // the bf16 copy to rewrite from the stepped values, or nullptr
};

// The flat layout shared by FlatSGD and FlatAdamW.
class FlatOptimizer : public torch::optim::Optimizer {
 public:
  // Zeroes each group's flat gradient buffer in one pass and points every defined gradient
  // into it; undefined gradients stay undefined, as with Optimizer::zero_grad. (That base
  // function, reached through an Optimizer&, zeroes each gradient in place: same result.)
  void zero_grad();

  // Group `group`'s parameters as one flat float32 tensor, each in its own memory order.
  torch::Tensor flat_params(size_t group) const;
  // Group `group`'s gradients, likewise; undefined until a step or zero_grad() saw one.
  torch::Tensor flat_grads(size_t group) const;

  // A bfloat16 copy of `param`, one of this optimizer's parameters, for a forward under bf16
  // autocast to read in its place (IPEX's bf16 training weights): a leaf requiring grad, with the
  // parameter's shape and strides, holding the parameter rounded to nearest even (autocast's cast).
  // A step takes the copy's gradient, when it has one, as the parameter's (which then holds it in
  // float32), steps the parameter as before and rewrites the copy in the same pass; zero_grad()
  // drops the copy's gradient. Steps without a gradient on the copy step the parameter as its own
  // gradient says (zero once the copy had one). The same tensor on every call for one parameter.
  torch::Tensor bf16_copy(const torch::Tensor& param);
  // Rewrites the copies whose parameters changed since their copy was written other than by a
  // step (loaded or assigned in place): call before a forward reads them.
  void refresh_bf16_copies();

 protected:
  // `name` prefixes error messages; `state_fields` names the per-parameter state tensors
  // that state_tensors() returns, each kept in a flat buffer of its own.
  FlatOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                std::unique_ptr<torch::optim::OptimizerOptions> defaults, std::string name,
                std::vector<std::string> state_fields);

  // The tensors of one parameter's state, in the order of `state_fields`.
  virtual std::vector<torch::Tensor*> state_tensors(torch::optim::OptimizerParamState& state) const = 0;

  // Moves the parameters of every group not yet flat into a flat buffer.
  void flatten_new_groups();
  // The parameters of a group that have a gradient at this step.
  struct Gradients {
    std::vector<size_t> params;
    // Per entry of `params`: the gradient if it is a tensor of its own (backward made a new one
    // after Module::zero_grad(true), or it is a bf16 copy's, in bfloat16), undefined if it
    // already is a slice of the flat buffer.
    std::vector<torch::Tensor> outside;
  };
  // Brings parameters that left their slice back and lists the group's gradients.
  Gradients gather_gradients(size_t group);
  // Calls update(param index, flat offset, count, chunk) over all elements of the gradients'
  // params, in chunks run in parallel on LibTorch's intra-op threads. Float32 gradients outside
  // the flat buffer are copied in just before update() reads them, and then become slices of it;
  // a bf16 copy's gradient is read where it is, and the chunk names the copy to rewrite.
  using Update = std::function<void(size_t, int64_t, int64_t, const FlatChunk&)>;
  void step_group(size_t group, const Gradients& gradients, const Update& update);

  float* params_data(size_t group);
  float* state_data(size_t group, size_t field);
  // A parameter's slice of a state buffer, shaped and strided like the parameter.
  torch::Tensor state_slice(size_t group, size_t param, size_t field);
  // The key of a parameter's entry in state_ (the one torch's optimizers use).
  const std::string& state_key(size_t group, size_t param) const;
  // After state_ was read from an archive: copies each state tensor into its flat buffer
  // and makes the entry a view of it, and brings moved parameters back. CheckpointError
  // when a shape does not fit.
  void adopt_loaded_state();
  // Runs the closure with gradients enabled, as torch's optimizers do.
  static torch::Tensor run_closure(const LossClosure& closure);
  const std::string& name() const { return name_; }

 private:
  // Where one parameter lives in its group's flat buffers.
  struct Slot {
    int64_t offset = 0;
    int64_t numel = 0;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
    std::string state_key;
  };
  // A parameter's bf16 copy and what it was last written from.
  struct Bf16Copy {
    torch::Tensor tensor;  // undefined: the parameter has no copy
    const void* written_from = nullptr;
    int64_t version = 0;  // the parameter's version counter then
    // A step took the copy's gradient: later steps without one step on a zero gradient, as the
    // parameter's own gradient, once defined, stays defined (zeroed) in the flat buffer.
    bool had_gradient = false;
  };
  struct FlatGroup {
    std::vector<Slot> slots;  // one per parameter, in param_groups_[g].params() order
    torch::Tensor params;
    torch::Tensor grads;                       // allocated when a gradient first shows up
    std::vector<torch::Tensor> state_buffers;  // one per state field, allocated on first use
    torch::Tensor copies;                      // bfloat16, at the slots' offsets; allocated by the first copy
    std::vector<Bf16Copy> copy_of;             // one per slot
  };

  // A tensor on `flat`'s storage at the slot, with the slot's sizes and strides.
  static torch::Tensor slice(const torch::Tensor& flat, const Slot& slot);
  static bool is_slice(const torch::Tensor& tensor, const torch::Tensor& flat, const Slot& slot);

  void check_param(size_t group, size_t param) const;
  void flatten_group(size_t group);
  void rehome_moved_params(size_t group);
  bool grad_in_place(size_t group, size_t param) const;
  torch::Tensor& grad_buffer(size_t group);  // allocated on first use
  void write_copy(size_t group, size_t param);
  torch::Tensor& state_buffer(size_t group, size_t field);
  const FlatGroup& flat_group(size_t group) const;

  std::string name_;
  std::vector<std::string> state_fields_;
  std::vector<FlatGroup> groups_;
};

class FlatSGD : public FlatOptimizer {
 public:
  FlatSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::SGDOptions defaults);
  FlatSGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults);

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<torch::Tensor*> state_tensors(torch::optim::OptimizerParamState& state) const override;
};

class FlatAdamW : public FlatOptimizer {
 public:
  FlatAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::AdamWOptions defaults);
  FlatAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults);

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<torch::Tensor*> state_tensors(torch::optim::OptimizerParamState& state) const override;
};

// One step of SGD or AdamW over separate tensors, in one fused pass split into chunks across
// them and run in parallel: the update of FlatSGD / FlatAdamW without their flat buffers, for
// optimizers that must leave each parameter's storage where it is (the Python package's
// FlatSGD / FlatAdamW, whose parameters move with Module.to()). The math is torch's SGD and
// AdamW, as above. Every tensor is float32 on the CPU and dense; a gradient laid out unlike its
// parameter is read from a copy in the parameter's layout; state tensors must share their
// parameter's layout. `fresh[i]`: parameter i's momentum buffer is new, so this step fills it
// (torch's first step); `steps[i]`: parameter i's AdamW step count, this step included. Call
// with gradient recording off. Throws UsageError naming the argument that does not fit.
void sgd_step(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
              const std::vector<bool>& fresh, const torch::optim::SGDOptions& options);
void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::IntArrayRef steps, const torch::optim::AdamWOptions& options);

}  // namespace afterburner::kernels
