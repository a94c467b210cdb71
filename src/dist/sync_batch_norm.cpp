#include "afterburner/dist/sync_batch_norm.h"

#include <torch/autograd.h>

#include <vector>

#include "afterburner/core/error.h"

namespace afterburner::dist {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Sums `values` over the ranks of `group`, in place.
void allreduce(c10d::ProcessGroup& group, torch::Tensor& values) {
  std::vector<torch::Tensor> tensors{values};
  group.allreduce(tensors)->wait();
}

// Per channel of x [N, C, ...], over every other dimension, accumulated in double: shape [C].
torch::Tensor channel_sum(const torch::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return x.sum(dims, /*keepdim=*/false, torch::kDouble);
}

// [C] -> [1, C, 1, ...], to broadcast against x.
torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = v.size(0);
  return v.reshape(shape);
}

// With n samples per channel over all ranks, mean = S1 / n, var = S2 / n - mean^2 (sums in double),
// x_hat = (x - mean) / sqrt(var + eps), y = x_hat w + b; backward, with the ranks' sums of dy
// and of dy x_hat: dx = w / sqrt(var + eps) (dy - sum(dy) / n - x_hat sum(dy x_hat) / n),
// dw = this rank's sum(dy x_hat), db = this rank's sum(dy).
struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, const torch::Tensor& weight,
                               const torch::Tensor& bias, torch::Tensor running_mean, torch::Tensor running_var,
                               double momentum, double eps, c10d::ProcessGroup* group) {
    const auto x = input.to(torch::kFloat);
    const int64_t channels = x.size(1);
    auto sums = torch::cat({channel_sum(x), channel_sum(x * x),
                            torch::full({1}, double(x.numel() / channels), torch::kDouble)});
    allreduce(*group, sums);
    const double count = sums[2 * channels].item<double>();
    const auto mean = sums.slice(0, 0, channels) / count;
    const auto var = (sums.slice(0, channels, 2 * channels) / count - mean * mean).clamp_min(0);
    const auto invstd = (var + eps).rsqrt().to(torch::kFloat);
    {
      torch::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (count / std::max(count - 1, 1.0))).to(running_var.scalar_type()),
                                          momentum);
    }
    const auto x_hat = (x - per_channel(mean.to(torch::kFloat), x)) * per_channel(invstd, x);
    ctx->save_for_backward({x_hat, invstd, weight});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["dtype"] = input.scalar_type();
    return (x_hat * per_channel(weight.to(torch::kFloat), x) + per_channel(bias.to(torch::kFloat), x))
        .to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x_hat = saved[0];
    const auto& invstd = saved[1];
    const auto& weight = saved[2];
    const double count = ctx->saved_data["count"].toDouble();
    auto* group = reinterpret_cast<c10d::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const auto dy = grad_outputs[0].to(torch::kFloat);
    const auto sum_dy = channel_sum(dy);
    const auto sum_dy_x_hat = channel_sum(dy * x_hat);
    auto sums = torch::cat({sum_dy, sum_dy_x_hat});
    allreduce(*group, sums);
    const int64_t channels = x_hat.size(1);
    const auto mean_dy = (sums.slice(0, 0, channels) / count).to(torch::kFloat);
    const auto mean_dy_x_hat = (sums.slice(0, channels, 2 * channels) / count).to(torch::kFloat);
    const auto dx = per_channel(weight.to(torch::kFloat) * invstd, x_hat) *
                    (dy - per_channel(mean_dy, x_hat) - x_hat * per_channel(mean_dy_x_hat, x_hat));
    const auto dtype = ctx->saved_data["dtype"].toScalarType();
    return {dx.to(dtype), sum_dy_x_hat.to(weight.scalar_type()), sum_dy.to(weight.scalar_type()),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                              torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps,
                              const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  if (input.dim() < 2 || weight.dim() != 1 || weight.size(0) != input.size(1)) {
    throw UsageError("sync_batch_norm", "expects input [N, C, ...] and a weight of C channels");
  }
  return SyncBatchNormFunction::apply(input, weight, bias, running_mean, running_var, momentum, eps, group.get());
}

SyncBatchNorm2dImpl::SyncBatchNorm2dImpl(int64_t channels, Group group)
    : channels_(channels), group_(std::move(group)) {
  reset();
}

void SyncBatchNorm2dImpl::reset() {
  weight = register_parameter("weight", torch::ones({channels_}));
  bias = register_parameter("bias", torch::zeros({channels_}));
  running_mean = register_buffer("running_mean", torch::zeros({channels_}));
  running_var = register_buffer("running_var", torch::ones({channels_}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

torch::Tensor SyncBatchNorm2dImpl::forward(const torch::Tensor& input) {
  if (!is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false, 0.0, kEps,
                             /*cudnn_enabled=*/false);
  }
  {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return sync_batch_norm(input, weight, bias, running_mean, running_var, kMomentum, kEps, group_.process_group);
}

std::string SyncBatchNorm2dImpl::torchscript_forward() const { return models::batch_norm_torchscript(kEps); }

}  // namespace afterburner::dist
