// Helpers for testing fused autograd kernels against torch: closeness with the largest
// difference in the message, CPU bf16 autocast for a scope, and finite-difference gradients.
#pragma once

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <vector>

namespace afterburner::testing {

// |actual - expected| <= atol + rtol * |expected| elementwise, compared in double.
inline ::testing::AssertionResult AllClose(const torch::Tensor& actual, const torch::Tensor& expected,
                                           double atol, double rtol = 0) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " vs expected " << expected.sizes();
  }
  const torch::Tensor a = actual.detach().to(torch::kDouble), e = expected.detach().to(torch::kDouble);
  const torch::Tensor excess = (a - e).abs() - (atol + rtol * e.abs());
  if (excess.numel() == 0 || excess.max().item<double>() <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "largest difference " << (a - e).abs().max().item<double>()
                                       << " exceeds atol " << atol << " + rtol " << rtol;
}

// CPU autocast to bf16 for the scope, as training's AutocastGuard does; restores the previous
// state and drops the cast weights on exit.
class BFloat16Autocast {
 public:
  BFloat16Autocast()
      : previous_enabled_(at::autocast::is_cpu_enabled()), previous_dtype_(at::autocast::get_autocast_cpu_dtype()) {
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
  ~BFloat16Autocast() {
    at::autocast::set_cpu_enabled(previous_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
    at::autocast::clear_cache();
  }
  BFloat16Autocast(const BFloat16Autocast&) = delete;
  BFloat16Autocast& operator=(const BFloat16Autocast&) = delete;

 private:
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

using ScalarFunction = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// Checks autograd's gradient of the scalar f at `inputs` (double tensors) against central
// differences (f(v + h) - f(v - h)) / 2h, element by element, for every input requiring grad.
inline void expect_gradients_match_finite_differences(const ScalarFunction& f, const std::vector<torch::Tensor>& inputs,
                                                      double h = 1e-6, double tolerance = 1e-7) {
  std::vector<torch::Tensor> differentiable;
  for (const auto& input : inputs) {
    if (input.requires_grad()) differentiable.push_back(input);
  }
  const std::vector<torch::Tensor> analytic = torch::autograd::grad({f(inputs)}, differentiable);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < differentiable.size(); ++i) {
    torch::Tensor flat = differentiable[i].view(-1);
    torch::Tensor numeric = torch::empty_like(flat);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double original = flat[e].item<double>();
      flat[e] = original + h;
      const double above = f(inputs).item<double>();
      flat[e] = original - h;
      const double below = f(inputs).item<double>();
      flat[e] = original;
      numeric[e] = (above - below) / (2 * h);
    }
    EXPECT_TRUE(AllClose(analytic[i].view(-1), numeric, tolerance, tolerance)) << "differentiable input " << i;
  }
}

}  // namespace afterburner::testing
