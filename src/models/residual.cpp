#include "afterburner/models/residual.h"

#include <torch/nn/functional/activation.h>

namespace afterburner::models {
namespace nn = torch::nn;

static nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

nn::AnyModule batch_norm_2d(int64_t channels) { return nn::AnyModule(nn::BatchNorm2d(channels)); }

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride,
                               const BatchNorm2dFactory& batch_norm)
    : conv1(register_module("conv1", conv(in_channels, out_channels, 3, stride))),
      conv2(register_module("conv2", conv(out_channels, out_channels, 3, 1))),
      bn1(batch_norm(out_channels)),
      bn2(batch_norm(out_channels)),
      shortcut(register_module("shortcut", nn::Sequential())) {
  register_module("bn1", bn1.ptr());
  register_module("bn2", bn2.ptr());
  if (stride != 1 || in_channels != out_channels) {
    shortcut->push_back(conv(in_channels, out_channels, 1, stride));
    shortcut->push_back(batch_norm(out_channels));
  }
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1.forward(conv1(x)));
  y = bn2.forward(conv2(y));
  auto skip = shortcut->is_empty() ? x : shortcut->forward(x);
  return torch::relu(y + skip);
}

}  // namespace afterburner::models
