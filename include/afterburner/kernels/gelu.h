// GELU in its exact (erf) form, as aten::gelu(x): the forward is LibTorch's own (oneDNN's, the
// same bits), the gradient ours, dx = dy (Phi(x) + x phi(x)) in one pass over 16 fp32 lanes
// that reads and writes bf16 directly, one exponential serving erf and the density.
// Transformers' MLPs and ConvNeXt's blocks run GELU on bf16 activations under autocast
// (BENCHMARKS.md, "GELU's gradient and LayerNorm": forward and backward together 1.04-1.34x
// LibTorch's at their sizes on a quiet machine, more under load).
//
//   torch::Tensor y = afterburner::kernels::gelu(x);   // x / 2 (1 + erf(x / sqrt(2)))
//
// The gradient for float and bf16 CPU tensors of any layout is ours (dy and x dense alike: in
// their layout; otherwise contiguous copies); for other tensors, and under create_graph (to be
// differentiable in turn), it is at::gelu_backward.
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

torch::Tensor gelu(const torch::Tensor& x);

}  // namespace afterburner::kernels
