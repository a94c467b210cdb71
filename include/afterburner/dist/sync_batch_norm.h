// Batch normalisation in training over the batch of all ranks together, as
// torch.nn.SyncBatchNorm: each rank normalises its own samples with the mean and variance of
// every rank's, and backward passes each rank the gradient of the loss of them all.
//
//   auto model = afterburner::models::make_model("resnet", afterburner::models::ModelOptions()
//       .batch_norm([&](int64_t channels) { return torch::nn::AnyModule(SyncBatchNorm2d(channels, group)); }));
//   auto y = afterburner::dist::sync_batch_norm(x, weight, bias, running_mean, running_var,
//                                               /*momentum=*/0.1, /*eps=*/1e-5, group.process_group);
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "afterburner/dist/group.h"
#include "afterburner/models/export.h"

namespace afterburner::dist {

// `input` is [N, C, ...]; weight, bias and the running statistics are [C]. Updates the running
// statistics in place (the unbiased variance, as BatchNorm does). The weight's and bias's
// gradients are this rank's part; DataParallel's averaging over the ranks completes them.
torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                              torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps,
                              const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// BatchNorm2d's parameters and buffers (same names and initial values, eps 1e-5, momentum 0.1),
// evaluation and export, with sync_batch_norm over `group` as its training forward. (Deriving
// from BatchNorm2dImpl would need a LibTorch symbol Debian's build does not export.)
class SyncBatchNorm2dImpl : public torch::nn::Cloneable<SyncBatchNorm2dImpl>, public models::SelfExportingLayer {
 public:
  SyncBatchNorm2dImpl(int64_t channels, Group group);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& input);
  std::string torchscript_kind() const override { return "BatchNorm2d"; }
  std::string torchscript_forward() const override;

  static constexpr double kEps = 1e-5, kMomentum = 0.1;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  int64_t channels_;
  Group group_;
};
TORCH_MODULE(SyncBatchNorm2d);

}  // namespace afterburner::dist
