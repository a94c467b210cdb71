// Compares an optimized model with its original on the same inputs, output by output.
//
//   auto agreement = afterburner::infer::verify(original, optimized, images);  // [N, 1, 28, 28]
//   if (!afterburner::infer::within(agreement, afterburner::infer::Tolerance{})) ...  // refuse to write it
//   std::cout << afterburner::infer::describe(agreement) << "\n";
//
//   // Several inputs (one tensor per forward argument, batch first), one Agreement per output:
//   auto per_output = afterburner::infer::verify_outputs(original, optimized, {images, features});
#pragma once

#include <torch/arg.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace afterburner::infer {

struct Agreement {
  double max_abs_diff = 0;     // over every output element
  double max_abs_expected = 0;  // the largest magnitude among the original's outputs: their scale
  // Fraction of argmaxes over the last dimension that agree: one per sample for [N, classes],
  // one per position for [N, ..., classes]. An output with fewer than two dimensions has no
  // classes to predict and counts as agreeing.
  double top1_agreement = 1;
  int64_t samples = 0;
};

// An output agrees when its max abs diff is at most max_abs_diff + relative x its scale (the
// reassociated sums of a deep network differ in proportion to its outputs' magnitude: logits in
// the thousands differ by hundredths in fp32), and its top-1 agreement at least the minimum.
struct Tolerance {
  TORCH_ARG(double, max_abs_diff) = 1e-3;
  TORCH_ARG(double, relative) = 0;
  TORCH_ARG(double, min_top1_agreement) = 0.999;
};

inline bool within(const Agreement& agreement, const Tolerance& tolerance) {
  return agreement.max_abs_diff <= tolerance.max_abs_diff() + tolerance.relative() * agreement.max_abs_expected &&
         agreement.top1_agreement >= tolerance.min_top1_agreement();
}

// "max abs diff 0.001 + 0.0001 of the outputs' scale, top-1 agreement 99.90%"
std::string describe(const Tolerance& tolerance);

// Every output within the tolerance.
bool within(const std::vector<Agreement>& outputs, const Tolerance& tolerance);

// The worst over outputs: the largest difference and the smallest agreement.
Agreement worst(const std::vector<Agreement>& outputs);

// "max abs diff 2.1e-06, top-1 agreement 100.00% (10000 samples)", and for outputs in the
// thousands "max abs diff 0.034 (5.6e-06 of their scale 6.12e+03), top-1 ..."
std::string describe(const Agreement& agreement);
// describe() of a single output; "output 0: max abs diff ...; output 1: ..." for several.
std::string describe(const std::vector<Agreement>& outputs);

// The tensors a forward returned: the tensor itself, or the elements of a tuple or list of
// tensors. Throws Error naming what else it holds.
std::vector<torch::Tensor> output_tensors(const c10::IValue& output);

// Runs both models on `inputs` (one tensor per forward argument, all [N, ...], any dtype) in
// chunks of `batch_size` samples under inference mode. Both must return the same number of
// tensors (output_tensors) with the same shapes, compared as float; otherwise throws Error
// saying which output differs. Returns one Agreement per output.
std::vector<Agreement> verify_outputs(torch::jit::Module& original, torch::jit::Module& optimized,
                                      const std::vector<torch::Tensor>& inputs, int64_t batch_size = 256);

// One input: worst(verify_outputs(original, optimized, {inputs}, batch_size)).
Agreement verify(torch::jit::Module& original, torch::jit::Module& optimized, const torch::Tensor& inputs,
                 int64_t batch_size = 256);

}  // namespace afterburner::infer
