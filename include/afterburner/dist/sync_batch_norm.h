// Batch normalisation in training over the batch of all ranks together, as
// torch.nn.SyncBatchNorm: each rank normalises its own samples with the mean and variance of
// every rank's, and backward passes each rank the gradient of the loss of them all.
//
//   auto y = afterburner::dist::sync_batch_norm(x, bn->weight, bn->bias, bn->running_mean,
//                                               bn->running_var, /*momentum=*/0.1, /*eps=*/1e-5,
//                                               group.process_group);
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/types.h>

namespace afterburner::dist {

// `input` is [N, C, ...]; weight, bias and the running statistics are [C]. Updates the running
// statistics in place (the unbiased variance, as BatchNorm does). The weight's and bias's
// gradients are this rank's part; DataParallel's averaging over the ranks completes them.
torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                              torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps,
                              const c10::intrusive_ptr<c10d::ProcessGroup>& group);

}  // namespace afterburner::dist
