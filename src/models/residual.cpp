#include "afterburner/models/residual.h"

#include <torch/nn/functional/activation.h>

namespace afterburner::models {
namespace nn = torch::nn;

static nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride)
    : conv1(register_module("conv1", conv(in_channels, out_channels, 3, stride))),
      conv2(register_module("conv2", conv(out_channels, out_channels, 3, 1))),
      bn1(register_module("bn1", nn::BatchNorm2d(out_channels))),
      bn2(register_module("bn2", nn::BatchNorm2d(out_channels))),
      shortcut(register_module("shortcut", nn::Sequential())) {
  if (stride != 1 || in_channels != out_channels) {
    shortcut->push_back(conv(in_channels, out_channels, 1, stride));
    shortcut->push_back(nn::BatchNorm2d(out_channels));
  }
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1(conv1(x)));
  y = bn2(conv2(y));
  auto skip = shortcut->is_empty() ? x : shortcut->forward(x);
  return torch::relu(y + skip);
}

}  // namespace afterburner::models
