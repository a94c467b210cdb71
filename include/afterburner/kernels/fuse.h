// Rewrites a Sequential model onto afterburner's fused training ops, keeping every parameter
// (the same tensors, under the same names) so checkpoints and exports work with either form;
// fuse_forward does the same for a TorchScript module's forward.
//
//   auto model = afterburner::models::make_model("cnn");
//   auto fused = afterburner::kernels::fuse(model);
//   for (const auto& notice : fused.notices) std::cerr << notice << "\n";
//   auto logits = fused.model->forward(images);     // same values, less time and memory
#pragma once

#include <torch/arg.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <string>
#include <vector>

namespace afterburner::kernels {

struct FuseOptions {
  TORCH_ARG(bool, relu_max_pool) = true;  // ReLU, MaxPool2d  ->  Identity, ReluMaxPool2d
  TORCH_ARG(bool, linear_relu) = true;    // Linear, ReLU     ->  LinearReLU, Identity
  // Conv2d, ReLU -> Conv2dReLU, Identity; not where the ReLU fuses with a following MaxPool2d,
  // which pools first and so applies ReLU to a quarter of the values.
  TORCH_ARG(bool, conv_relu) = true;
};

struct FuseResult {
  torch::nn::Sequential model;       // a new container; the layers it keeps are shared
  std::vector<std::string> fused;    // one entry per rewrite, e.g. "layers 1-2: ReLU + MaxPool2d"
  std::vector<std::string> notices;  // patterns left unfused, one line each, with the reason
};

// Layers are replaced position for position (a fused pair becomes the fused op plus an
// Identity), so parameter names stay those of the input model. Only the top level is
// rewritten: layers inside other modules (a residual block's convolutions) stay as they are.
FuseResult fuse(const torch::nn::Sequential& model, const FuseOptions& options = {});

// TorchScript modules (a model written in Python, scripted or traced) get the same fusions in
// a new forward that runs on the module, which itself stays as it was (so its export is plain
// TorchScript that Python loads without afterburner):
//
//   auto fused = afterburner::kernels::fuse_forward(script);
//   torch::Tensor logits = (*fused.forward)({script._ivalue(), images}).toTensor();
struct ScriptFuseResult {
  std::shared_ptr<torch::jit::Function> forward;  // takes (module, input) as the module's forward does
  std::vector<std::string> fused;                  // e.g. "2 x relu + max_pool2d"
  std::vector<std::string> notices;                // what stayed unfused
};

// forward's graph with the submodules' forwards inlined and relu then max_pool2d, conv2d then
// relu (unless that relu goes to a max_pool2d) and linear then relu rewritten onto afterburner's
// ops, the other conv2d onto afterburner::conv2d (depthwise ones and those of 1-pixel images
// train their own way: kernels/conv2d.h), dropout onto afterburner::dropout (the same draws, in
// bulk: kernels/dropout.h; of probability 0, the input itself), and scripted
// nn.MultiheadAttention onto afterburner::attention (MHA's own code kept for what the fused op
// does not compute as it does, chosen as the forward runs; nn.TransformerEncoderLayer's and
// TransformerEncoder's evaluation fast paths, which fail under CPU autocast in LibTorch 1.13,
// off). Parameters stay the module's: training through the result trains the module.
ScriptFuseResult fuse_forward(const torch::jit::Module& module);

// relu (or an in-place relu_ of a value nothing else reads) then max_pool2d, in `graph` as it
// stands (no inlining), rewritten onto afterburner::relu_max_pool2d; returns how many were.
int fuse_relu_max_pool2d(std::shared_ptr<torch::jit::Graph>& graph);

// Every aten::layer_norm of `graph` (inner blocks included) onto afterburner::layer_norm
// (kernels/layer_norm.h), which hands the cases it does not take back to LibTorch; those read only
// by aten::linear marked bf16_for_autocast (under bf16 autocast they hand the Linear layers the
// bf16 values autocast would cast to). Returns how many. fuse_forward does it for training;
// optimize's runtime for inference.
int layer_norms_onto_ours(std::shared_ptr<torch::jit::Graph>& graph);

// A copy of `module` (types of its own, the same parameter and buffer tensors) whose forward is
// fused as fuse_forward's: calling, training or saving it runs the fused ops. Python's
// afterburner.jit.fuse returns it (the op afterburner::fuse_script).
struct FusedScript {
  torch::jit::Module module;
  std::vector<std::string> fused;    // e.g. "2 x relu + max_pool2d"
  std::vector<std::string> notices;  // what stayed unfused
};
FusedScript fuse_script(const torch::jit::Module& module);

// Replaces every call in `graph` (to a submodule's method or a function) by the callee's own
// graph, until no call is left; the callees are left as they were. Not jit::Inline, which
// inlines each callee's optimized_graph(): LibTorch computes that once and caches it in the
// callee, so it can be stale (un-inlined when the callee first ran with the executor's
// optimizations off) and, once computed, it is what the callee's callers run from then on, even
// after a submodule inside it was swapped for one of another class.
void inline_calls(torch::jit::Graph& graph);

}  // namespace afterburner::kernels
