// An inference graph's fp32 convolutions and the activations after them as one oneDNN
// convolution that applies the activation (a post-op) while each output is still in registers,
// instead of a second pass that reads and writes the whole output again: EfficientNet-B0's SiLUs
// took a third of its time at batch 32, MobileNetV3's Hardswishes and ReLUs a fifth. The rewritten
// graph calls afterburner::conv2d_activation, an operator registered by this library: it runs in
// this process and is not meant to be saved.
//
//   Module prepared = torch::jit::optimize_for_inference(frozen);
//   auto graph = prepared.get_method("forward").graph();
//   afterburner::infer::propagate_non_finite_as_aten(graph);             // relu as hardtanh(x, 0, inf)
//   int fused = afterburner::infer::fuse_activations_into_convolutions(graph);
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// Rewrites a oneDNN convolution of constant fp32 weights (prim::mkldnn_convolution,
// afterburner::conv2d_winograd) whose output is read by an activation alone, in place or not,
// onto afterburner::conv2d_activation: hardtanh and clamp of constant bounds around 0 (ReLU and
// ReLU6 in the forms propagate_non_finite_as_aten leaves), hardswish, silu, and gelu (erf form).
// oneDNN computes SiLU and GELU with exp and erf of its own (within a few fp32 roundings of
// ATen's), and sums holding NaN or an infinity not as ATen does (its ReLU turns NaN into 0). So
// each call bounds the sums by its input's largest magnitude, read from the input or taken from
// the op that made it (another fused convolution, afterburner::scale_shift_relu_to_onednn, which
// return the bound of their values alongside them): an input holding
// NaN or an infinity, or values large enough that a sum could overflow, is convolved and then
// activated apart, by the unfused graph's ops and with its answer. And a Winograd convolution
// (afterburner::conv2d_winograd) whose output a residual is added to in place and then ReLU'd,
// ResNet's `out += identity; relu(out)`, onto afterburner::conv2d_add_relu: under the same rule,
// the residual's magnitude added to the bound, the Winograd output is not read again for NaN and
// the sum and ReLU take one pass over it, not two. Returns how many were rewritten.
int fuse_activations_into_convolutions(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
