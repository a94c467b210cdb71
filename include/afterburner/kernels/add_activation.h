// A residual sum and its activation, act(a + b), in one pass forward and one backward: what
// `F.silu(self.bn(self.conv(x)) + x)` or `F.relu(out + identity)` computes in four to seven
// passes under TorchScript's bf16 autocast (its pass widens both terms of an add to fp32, the
// activation runs in fp32, its result is narrowed again for the next convolution, and each cast
// has a backward of its own).
//
//   torch::Tensor y = afterburner::kernels::add_activation(a, b, afterburner::kernels::Activation::silu);
//
// The answer is eager LibTorch's for act(a + b) (autocast leaves both ops as they are): the sum in
// the dtype the two promote to (bf16 only when both are), rounded once, then the activation of
// that sum, rounded once; relu as at::relu (NaN stays, -0 stays -0), silu as x / (1 + exp(-x)).
// The gradient reaches a and b alike, as dy where relu's output is above 0 (at::threshold_backward)
// and dy sigmoid(s) (1 + s (1 - sigmoid(s))) for silu (at::silu_backward), computed in fp32 from
// the output's dtype. Taken here: fp32 and bf16 CPU tensors of one shape and the same dense
// layout (any memory format); others (broadcasting, strided views, other dtypes) are LibTorch's
// add and activation, as is the gradient under create_graph. relu keeps its output for the
// gradient, as at::relu does; silu keeps the two terms (as much memory as the sum eager keeps),
// so writing a term in place before backward is refused by autograd (the fuse rewrite leaves
// such a sum to LibTorch).
#pragma once

#include <torch/types.h>

#include <string>

namespace afterburner::kernels {

enum class Activation { relu, silu };

// The activation of that name ("relu", "silu"); throws afterburner::UsageError naming `field`
// for any other.
Activation activation_named(const std::string& name, const std::string& field);

torch::Tensor add_activation(const torch::Tensor& a, const torch::Tensor& b, Activation activation);

}  // namespace afterburner::kernels
