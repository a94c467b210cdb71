// Compares an optimized model with its original on the same inputs.
//
//   auto agreement = afterburner::infer::verify(original, optimized, images);  // [N, 1, 28, 28]
//   if (!agreement.within(afterburner::infer::Tolerance{})) ...  // refuse to write it
//   std::cout << afterburner::infer::describe(agreement) << "\n";
#pragma once

#include <torch/arg.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>

namespace afterburner::infer {

struct Agreement {
  double max_abs_diff = 0;     // over every output element
  double top1_agreement = 1;   // fraction of samples whose argmax over the last dim agrees
  int64_t samples = 0;
};

struct Tolerance {
  TORCH_ARG(double, max_abs_diff) = 1e-3;
  TORCH_ARG(double, min_top1_agreement) = 0.999;
};

inline bool within(const Agreement& agreement, const Tolerance& tolerance) {
  return agreement.max_abs_diff <= tolerance.max_abs_diff() &&
         agreement.top1_agreement >= tolerance.min_top1_agreement();
}

// "max abs diff 2.1e-06, top-1 agreement 100.00% (10000 samples)"
std::string describe(const Agreement& agreement);

// Runs both models on `inputs` ([N, ...] float32, in chunks of `batch_size`) under inference
// mode. Outputs must be float tensors of the same shape; otherwise throws Error saying which.
Agreement verify(torch::jit::Module& original, torch::jit::Module& optimized, const torch::Tensor& inputs,
                 int64_t batch_size = 256);

}  // namespace afterburner::infer
