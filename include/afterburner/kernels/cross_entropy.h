// Cross-entropy (log-softmax + NLL, mean over rows) as one autograd node: the forward reads the
// logits once and keeps only each row's log-sum-exp; the backward writes the gradient in one pass.
//
//   torch::Tensor logits = model->forward(images);          // [N, classes], float/double/bf16
//   torch::Tensor loss = afterburner::kernels::cross_entropy(logits, labels);  // labels: [N] int64
//   loss.backward();
//
// Matches torch::nn::functional::cross_entropy with mean reduction, no class weights and no
// label smoothing, including its result dtype: the logits' dtype, or float32 for bf16 logits
// under CPU autocast. bf16 logits are accumulated in float. Every target must be a class (there
// is no ignore_index). CPU tensors only. The backward is differentiable itself (create_graph).
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

// Throws UsageError naming the argument for a bad shape, dtype or device, and for a target
// outside [0, classes) its value, its row and the number of classes.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& target);

}  // namespace afterburner::kernels
