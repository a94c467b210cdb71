// For the autograd functions whose backward is a kernel of their own: under create_graph that
// backward must be differentiable in turn, so they form their gradients from LibTorch's unfused
// ops instead, recomputed from the saved inputs, and get LibTorch's second-order answers (NaN
// where it multiplies a zero by an infinity, too). Internal to src/kernels.
#pragma once

#include <torch/autograd.h>

namespace afterburner::kernels {

// d(output . grad)/d(each input) as a graph of its own (create_graph), undefined for inputs that
// are undefined or do not require grad.
inline torch::autograd::variable_list gradients_of(const torch::Tensor& output,
                                                   const torch::autograd::variable_list& inputs,
                                                   const torch::Tensor& grad) {
  torch::autograd::variable_list differentiable;
  for (const auto& input : inputs) {
    if (input.defined() && input.requires_grad()) differentiable.push_back(input);
  }
  const auto grads = torch::autograd::grad({output}, differentiable, {grad}, /*retain_graph=*/true,
                                           /*create_graph=*/true, /*allow_unused=*/true);
  torch::autograd::variable_list result;
  std::size_t next = 0;
  for (const auto& input : inputs) {
    result.push_back(input.defined() && input.requires_grad() ? grads[next++] : torch::Tensor());
  }
  return result;
}

}  // namespace afterburner::kernels
