// LayerNorm as aten::layer_norm, its forward and backward each one pass over the rows in 16 fp32
// lanes. Under CPU autocast LayerNorm runs in fp32 (autocast's policy for it): LibTorch first
// copies a bf16 input to fp32; this reads the bf16 input as it is and writes the fp32 result
// autocast would, and its gradient reaches the input in bf16, as the copy's backward rounds it.
//
//   torch::Tensor y = afterburner::kernels::layer_norm(x, {x.size(-1)}, weight, bias, 1e-5);
//
// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimensions (`normalized_shape`),
// var the biased variance, in fp32. Taken here: fp32 and bf16 inputs with fp32, bf16 (or no)
// weight and bias. The result is fp32 under autocast (its policy for LayerNorm) and otherwise of
// the input's dtype, rounded once from fp32 (where LibTorch 1.13's bf16 kernel rounds as it goes);
// other dtypes are at::layer_norm's. Without autograd (inference) nothing is kept for a backward.
// The weight's and bias's gradients are summed over fixed blocks of rows in a fixed order: the
// same bits whatever the thread count. Second-order gradients (create_graph) are refused.
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

// bf16_for_autocast: under bf16 autocast, the result rounded to bf16 (the same bits as autocast's
// cast of the fp32 result), for a LayerNorm whose every reader is an op autocast runs in bf16 (a
// Linear after it): the cast and its backward's widening are then not made. No effect elsewhere.
torch::Tensor layer_norm(const torch::Tensor& x, at::IntArrayRef normalized_shape, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps, bool bf16_for_autocast = false);

}  // namespace afterburner::kernels
