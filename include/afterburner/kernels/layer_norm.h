// LayerNorm as aten::layer_norm, its forward and backward each one pass over the rows in 16 fp32
// lanes. Under CPU autocast LayerNorm runs in fp32 (autocast's policy for it): LibTorch first
// copies a bf16 input to fp32; this reads the bf16 input as it is and writes the fp32 result
// autocast would, and its gradient reaches the input in bf16, as the copy's backward rounds it.
//
//   torch::Tensor y = afterburner::kernels::layer_norm(x, {x.size(-1)}, weight, bias, 1e-5);
//
// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimensions (`normalized_shape`),
// var the biased variance, in fp32. Taken here: fp32 inputs, and bf16 inputs under autocast, with
// fp32 (or no) weight and bias; every other case is at::layer_norm. The weight's and bias's
// gradients are summed over fixed blocks of rows in a fixed order: the same bits whatever the
// thread count. Second-order gradients (create_graph) are refused.
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

torch::Tensor layer_norm(const torch::Tensor& x, at::IntArrayRef normalized_shape, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps);

}  // namespace afterburner::kernels
