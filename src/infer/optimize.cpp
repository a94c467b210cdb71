#include "afterburner/infer/optimize.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/passes/frozen_conv_folding.h>
#include <torch/csrc/jit/passes/remove_dropout.h>
#include <torch/script.h>

#include <algorithm>

#include "afterburner/core/error.h"
#include "afterburner/infer/attention_fast_paths.h"
#include "afterburner/infer/channel_concat.h"
#include "afterburner/infer/conv_activation.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/non_finite.h"
#include "afterburner/infer/onednn_checks.h"
#include "afterburner/infer/onednn_graph.h"
#include "afterburner/infer/onednn_linear.h"
#include "afterburner/infer/packed_conv.h"
#include "afterburner/infer/pool_first.h"
#include "afterburner/infer/winograd_conv.h"
#include "afterburner/kernels/fuse.h"
#include "graph_edits.h"

namespace afterburner::infer {
using torch::jit::Graph;
using torch::jit::Module;
using torch::jit::Node;

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "int8") return Precision::int8;
  throw UsageError("precision", "'" + name + "' is not one of fp32, bf16, int8");
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::int8: return "int8";
  }
  return "unknown";
}

Tolerance default_tolerance(Precision precision) {
  switch (precision) {
    case Precision::fp32: return Tolerance().max_abs_diff(1e-3).relative(1e-4).min_top1_agreement(0.999);
    case Precision::bf16: return Tolerance().max_abs_diff(0.5).relative(0.05).min_top1_agreement(0.995);
    case Precision::int8: return Tolerance().max_abs_diff(1.0).relative(0.05).min_top1_agreement(0.99);
  }
  return Tolerance();
}

namespace {

std::shared_ptr<Graph> forward_graph(const Module& model) { return model.get_method("forward").graph(); }

// Convolutions, BatchNorm and activations give outputs of their input's rank (batched or not), so
// `dim()` of their output reads the first input of such a chain instead. BatchNorm's
// _check_input_dim reads it, and that extra use of a convolution's output stops LibTorch folding
// the BatchNorm into the convolution (DenseNet's every norm2 after its 1x1 convolution; freezing
// drops the check in a plain Sequential), as one of a ReLU's output stops the BatchNorm + ReLU
// rewrite in front of it.
void read_ranks_at_their_source(torch::jit::Block* block) {
  static const std::vector<c10::Symbol> rank_keeping{
      c10::aten::conv1d, c10::aten::conv2d,   c10::aten::conv3d,   c10::aten::_convolution, c10::aten::batch_norm,
      c10::aten::relu,   c10::aten::relu_,    c10::aten::hardtanh, c10::aten::hardtanh_,    c10::aten::silu,
      c10::aten::silu_,  c10::aten::hardswish, c10::aten::hardswish_, c10::aten::gelu,      c10::aten::sigmoid};
  for (Node* node : block->nodes()) {
    for (auto* inner : node->blocks()) read_ranks_at_their_source(inner);
    if (node->kind() != c10::aten::dim) continue;
    torch::jit::Value* source = node->input(0);
    while (std::find(rank_keeping.begin(), rank_keeping.end(), source->node()->kind()) != rank_keeping.end()) {
      source = source->node()->input(0);
    }
    node->replaceInput(0, source);
  }
}

// "x: Tensor, mask: Optional[Tensor]" and "self._to_bfloat16(x), mask" for forward's arguments
// after self: floating-point tensors go in as bfloat16, everything else as it is.
struct WrappedArguments {
  std::vector<std::string> declared;
  std::vector<std::string> passed;
};

WrappedArguments wrapped_arguments(const c10::FunctionSchema& schema) {
  WrappedArguments wrapped;
  for (size_t i = 1; i < schema.arguments().size(); ++i) {
    const auto& argument = schema.arguments()[i];
    const bool tensor = argument.type()->kind() == c10::TypeKind::TensorType;
    wrapped.declared.push_back(fmt::format("{}: {}", argument.name(), argument.type()->annotation_str()));
    wrapped.passed.push_back(tensor ? fmt::format("self._to_bfloat16({})", argument.name()) : argument.name());
  }
  return wrapped;
}

// The body of the wrapper's forward after its call to the model: a tensor or each element of a
// tuple of tensors back to float32. Throws Error for other return types.
std::string returned_in_float32(const c10::FunctionSchema& schema) {
  const c10::TypePtr& type = schema.returns().at(0).type();
  if (type->kind() == c10::TypeKind::TensorType) return "    return self._to_float32(y)\n";
  const auto tuple = type->cast<c10::TupleType>();
  const bool tensors = tuple && !tuple->elements().empty() &&
                       std::all_of(tuple->elements().begin(), tuple->elements().end(),
                                   [](const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; });
  if (!tensors) {
    throw Error("optimize: bf16 handles models returning a tensor or a tuple of tensors; forward returns " +
                type->annotation_str());
  }
  std::vector<std::string> converted;
  for (size_t i = 0; i < tuple->elements().size(); ++i) converted.push_back(fmt::format("self._to_float32(y[{}])", i));
  return fmt::format("    return ({}{})\n", fmt::join(converted, ", "), converted.size() == 1 ? "," : "");
}

// Each float32 tensor constant of `block` (a frozen model's weights and buffers) as bfloat16;
// 4-D ones (convolution weights) channels-last. Returns how many were converted.
int constants_to_bfloat16(torch::jit::Block* block) {
  int converted = 0;
  for (Node* node : block->nodes()) {
    for (torch::jit::Block* inner : node->blocks()) converted += constants_to_bfloat16(inner);
    if (node->kind() != c10::prim::Constant || !node->output()->type()->cast<c10::TensorType>()) continue;
    const auto value = torch::jit::toIValue(node->output());
    if (!value || !value->isTensor() || value->toTensor().scalar_type() != torch::kFloat) continue;
    torch::Tensor tensor = value->toTensor().to(torch::kBFloat16);
    if (tensor.dim() == 4) {
      // Not contiguous(ChannelsLast): with one input channel NCHW strides already pass as
      // channels-last, and oneDNN would then pick NCHW for the whole network.
      tensor = torch::empty_like(tensor, torch::MemoryFormat::ChannelsLast).copy_(tensor);
    }
    node->t_(c10::attr::value, tensor);
    node->output()->inferTypeFrom(tensor);
    ++converted;
  }
  return converted;
}

// The frozen model computing in bfloat16, its weights rounded after BatchNorm was folded into
// them in float32 (folding in bfloat16 tripled EfficientNet-B0's error against float32);
// callers still pass and get float32 (integer inputs and outputs, such as token ids, pass as
// they are). Images go channels-last: oneDNN's bf16 convolutions and ATen's bf16 pooling run on
// that layout without reordering, three times the speed of bf16 NCHW (and of fp32 on oneDNN's
// blocked layout) on the zoo cnn. The wrapper's forward takes the model's arguments by name.
Module in_bfloat16(Module frozen, std::vector<std::string>& passes) {
  const c10::FunctionSchema schema = frozen.get_method("forward").function().getSchema();
  const std::string returned = returned_in_float32(schema);
  const WrappedArguments arguments = wrapped_arguments(schema);
  const int converted = constants_to_bfloat16(forward_graph(frozen)->block());
  Module wrapper("__torch__.afterburner.BFloat16Model");
  wrapper.register_module("model", frozen);
  // TorchScript source defined from C++ has no `torch` module to name dtypes and memory formats
  // by: each is its enum's number.
  wrapper.define(fmt::format(
      "def _to_bfloat16(self, x: Tensor) -> Tensor:\n"
      "    if not x.is_floating_point():\n"
      "        return x\n"
      "    x = x.to({bf16})\n"
      "    if x.dim() == 4:\n"
      "        x = x.contiguous(memory_format={channels_last})\n"
      "    return x\n"
      "\n"
      "def _to_float32(self, y: Tensor) -> Tensor:\n"
      "    if y.is_floating_point():\n"
      "        return y.to({fp32})\n"
      "    return y\n"
      "\n"
      "def forward(self, {declared}):\n"
      "    y = self.model.forward({passed})\n"
      "{returned}",
      fmt::arg("bf16", static_cast<int>(torch::kBFloat16)), fmt::arg("fp32", static_cast<int>(torch::kFloat)),
      fmt::arg("channels_last", static_cast<int>(torch::MemoryFormat::ChannelsLast)),
      fmt::arg("declared", fmt::join(arguments.declared, ", ")), fmt::arg("passed", fmt::join(arguments.passed, ", ")),
      fmt::arg("returned", returned)));
  wrapper.eval();
  passes.push_back(fmt::format("bf16: {} weights and buffers converted after folding, convolutions channels-last, "
                               "inputs cast to bfloat16, outputs back to float32",
                               converted));
  return torch::jit::freeze_module(wrapper);
}

// Removes the nodes `pass` targets and reports how many went.
template <typename Pass>
std::string run_counted(const std::shared_ptr<Graph>& graph, const std::vector<std::string>& kinds,
                        Pass pass, const std::string& description) {
  const int before = count_nodes(graph->block(), kinds);
  pass();
  return fmt::format("{}: {} of {} removed", description, before - count_nodes(graph->block(), kinds), before);
}

// Per output channel, symmetric: w ~= scale[o] * q[o][i], q in [-127, 127], zero point 0 (what
// oneDNN requires of weights).
torch::Tensor quantize_weight(const torch::Tensor& weight) {
  auto scales = (weight.abs().amax(1) / 127.0).clamp_min(1e-12).to(torch::kDouble);
  auto zero_points = torch::zeros({weight.size(0)}, torch::kLong);
  return torch::quantize_per_channel(weight.contiguous(), scales, zero_points, 0, torch::kQInt8);
}

c10::IValue prepack_linear(const torch::Tensor& weight, const c10::IValue& bias) {
  static const auto prepack =
      c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "");
  torch::jit::Stack stack{quantize_weight(weight), bias};
  prepack.callBoxed(&stack);
  return stack.at(0);
}

// y = x W^T + b as quantized::linear_dynamic: x is quantized to uint8 per call (scale from its
// own min/max), multiplied in int8 against the prepacked W, and the int32 sum rescaled to fp32.
// Only linears whose weight is a frozen constant are rewritten; returns how many were.
int quantize_linears(Module& model) {
  // oneDNN uses AVX512-VNNI where the CPU has it; QNNPACK is the fallback.
  const auto& engines = at::globalContext().supportedQEngines();
  if (std::find(engines.begin(), engines.end(), at::QEngine::ONEDNN) != engines.end()) {
    at::globalContext().setQEngine(at::QEngine::ONEDNN);
  }
  auto graph = forward_graph(model);
  torch::jit::Value* self = graph->inputs().at(0);
  std::vector<Node*> linears;
  for (Node* node : graph->nodes()) {
    if (node->kind() == c10::Symbol::fromQualString("aten::linear") &&
        torch::jit::toIValue(node->input(1)).has_value() && torch::jit::toIValue(node->input(2))) {
      linears.push_back(node);
    }
  }
  for (size_t i = 0; i < linears.size(); ++i) {
    Node* linear = linears[i];
    const auto weight = torch::jit::toIValue(linear->input(1))->toTensor();
    const auto packed = prepack_linear(weight, *torch::jit::toIValue(linear->input(2)));
    const std::string name = fmt::format("int8_linear_{}", i);
    model.register_attribute(name, packed.type(), packed);
    torch::jit::WithInsertPoint insert_point(linear);
    auto* packed_value = graph->insertGetAttr(self, name);
    auto* quantized = graph->insert(c10::Symbol::fromQualString("quantized::linear_dynamic"),
                                    {linear->input(0), packed_value});
    linear->output()->replaceAllUsesWith(quantized);
    linear->destroy();
  }
  torch::jit::EliminateDeadCode(graph);
  return static_cast<int>(linears.size());
}

}  // namespace

OptimizeResult optimize(const Module& model, const OptimizeOptions& options) {
  if (!model.find_method("forward")) throw Error("optimize: the model has no forward method");
  OptimizeResult result;
  auto& passes = result.passes;
  Module working = copy_model(model);
  working.eval();
  const size_t parameters = working.parameters().size() + working.buffers().size();
  Module frozen = torch::jit::freeze_module(working);
  auto graph = forward_graph(frozen);
  passes.push_back(fmt::format("freeze: {} parameters and buffers inlined as constants, submodule calls inlined",
                               parameters));
  passes.push_back(run_counted(graph, {"aten::dropout", "aten::dropout_", "aten::feature_dropout"},
                               [&] { torch::jit::removeDropout(graph); }, "dropout removal"));
  passes.push_back(run_counted(graph, {"aten::batch_norm"},
                               [&] {
                                 read_ranks_at_their_source(graph->block());
                                 torch::jit::FoldFrozenConvBatchnorm(graph);
                                 torch::jit::FoldFrozenConvAddOrSub(graph);
                                 torch::jit::FoldFrozenConvMulOrDiv(graph);
                               },
                               "conv + BatchNorm folding: BatchNorm"));
  if (options.precision() == Precision::bf16) frozen = in_bfloat16(frozen, passes);
  if (options.precision() == Precision::int8) {
    passes.push_back(fmt::format("int8: {} Linear layers quantized dynamically (int8 weights per channel, engine {})",
                                 quantize_linears(frozen), c10::toString(at::globalContext().qEngine())));
  }
  result.model = frozen;
  return result;
}

Module prepare_for_inference(const Module& optimized) {
  Module copy = copy_model(optimized);
  // optimize_for_inference freezes a module that is not yet frozen (one with a training
  // attribute), then converts. Freezing here as it would lets the check see the graph the
  // conversion gets; the frozen module has no training attribute, so it is not frozen again.
  Module frozen = copy.type()->hasAttribute("training") ? torch::jit::freeze(copy) : copy;
  auto frozen_graph = forward_graph(frozen);
  // The conversion starts with constant propagation too: lists of constants become constants.
  torch::jit::ConstantPropagation(frozen_graph, /*ignore_custom_classes=*/true);
  check_onednn_layouts(*frozen_graph);
  clamp_bounds_as_floats(*frozen_graph);
  average_pools_as_aten(*frozen_graph);
  Module prepared = torch::jit::optimize_for_inference(frozen);
  auto graph = prepared.get_method("forward").graph();
  convolve_channels_last_densely(graph);
  route_matmuls_to_onednn(graph);
  add_scaled_linears_to_residuals(graph);
  route_attention_fast_paths_to_ours(graph);
  fuse_composed_attention(graph);
  convolve_3x3_by_winograd(graph);
  pack_bf16_convolutions(graph);
  kernels::layer_norms_onto_ours(graph);  // LibTorch 1.13 rounds bf16 LayerNorm as it goes, and slowly
  multiply_broadcasts_on_onednn(graph);
  propagate_non_finite_as_aten(graph);
  read_sizes_on_onednn(graph);  // first: a size read keeps alive a dense copy the moves would drop
  move_onto_onednn(graph);
  batch_norm_relu_into_onednn(graph);  // after the NaN rewrites: its dense ReLU is LibTorch's already
  fuse_activations_into_convolutions(graph);  // after the NaN rewrites and the moves: ReLU is hardtanh by then
  pool_before_pointwise_convolutions(graph);
  concatenate_into_growing_buffers(graph);
  return prepared;
}

Module load_optimized(const std::string& path) { return prepare_for_inference(load_model(path)); }

}  // namespace afterburner::infer
