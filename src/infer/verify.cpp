#include "afterburner/infer/verify.h"

#include <fmt/format.h>
#include <torch/script.h>

#include <cmath>
#include <limits>

#include "afterburner/core/error.h"

namespace afterburner::infer {

std::string describe(const Agreement& agreement) {
  return fmt::format("max abs diff {:.3g}, top-1 agreement {:.2f}% ({} samples)", agreement.max_abs_diff,
                     100.0 * agreement.top1_agreement, agreement.samples);
}

namespace {

torch::Tensor run(torch::jit::Module& model, const torch::Tensor& input, const char* which) {
  auto output = model.forward({input});
  if (!output.isTensor()) throw Error(fmt::format("verify: the {} model does not return a tensor", which));
  return output.toTensor().to(torch::kFloat);
}

}  // namespace

Agreement verify(torch::jit::Module& original, torch::jit::Module& optimized, const torch::Tensor& inputs,
                 int64_t batch_size) {
  c10::InferenceMode inference;
  Agreement agreement;
  int64_t agreeing = 0;
  for (int64_t start = 0; start < inputs.size(0); start += batch_size) {
    auto chunk = inputs.slice(0, start, start + batch_size);
    auto expected = run(original, chunk, "original");
    auto actual = run(optimized, chunk, "optimized");
    if (expected.sizes() != actual.sizes()) {
      throw Error(fmt::format("verify: output shapes differ: original {} vs optimized {}",
                              c10::str(expected.sizes()), c10::str(actual.sizes())));
    }
    // A NaN must fail verification, and std::max would silently skip it.
    double diff = (expected - actual).abs().max().item<double>();
    if (!std::isfinite(diff)) diff = std::numeric_limits<double>::infinity();
    agreement.max_abs_diff = std::max(agreement.max_abs_diff, diff);
    agreeing += expected.argmax(-1).eq(actual.argmax(-1)).sum().item<int64_t>();
    agreement.samples += chunk.size(0);
  }
  if (agreement.samples > 0) agreement.top1_agreement = static_cast<double>(agreeing) / agreement.samples;
  return agreement;
}

}  // namespace afterburner::infer
