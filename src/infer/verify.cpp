#include "afterburner/infer/verify.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "afterburner/core/error.h"

namespace afterburner::infer {

bool within(const std::vector<Agreement>& outputs, const Tolerance& tolerance) {
  return std::all_of(outputs.begin(), outputs.end(), [&](const Agreement& output) { return within(output, tolerance); });
}

Agreement worst(const std::vector<Agreement>& outputs) {
  Agreement result;
  for (const auto& output : outputs) {
    result.max_abs_diff = std::max(result.max_abs_diff, output.max_abs_diff);
    result.max_abs_expected = std::max(result.max_abs_expected, output.max_abs_expected);
    result.top1_agreement = std::min(result.top1_agreement, output.top1_agreement);
    result.samples = std::max(result.samples, output.samples);
  }
  return result;
}

std::string describe(const Agreement& agreement) {
  const bool scaled = agreement.max_abs_diff > 0 && agreement.max_abs_expected > 1;
  return fmt::format("max abs diff {:.3g}{}, top-1 agreement {:.2f}% ({} samples)", agreement.max_abs_diff,
                     scaled ? fmt::format(" ({:.2g} of their scale {:.3g})", agreement.max_abs_diff / agreement.max_abs_expected,
                                          agreement.max_abs_expected)
                            : "",
                     100.0 * agreement.top1_agreement, agreement.samples);
}

std::string describe(const Tolerance& tolerance) {
  return fmt::format("max abs diff {:g}{}, top-1 agreement {:.2f}%", tolerance.max_abs_diff(),
                     tolerance.relative() > 0 ? fmt::format(" + {:g} of the outputs' scale", tolerance.relative()) : "",
                     100.0 * tolerance.min_top1_agreement());
}

std::string describe(const std::vector<Agreement>& outputs) {
  if (outputs.size() == 1) return describe(outputs[0]);
  std::vector<std::string> parts;
  for (size_t i = 0; i < outputs.size(); ++i) parts.push_back(fmt::format("output {}: {}", i, describe(outputs[i])));
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::vector<torch::Tensor> output_tensors(const c10::IValue& output) {
  if (output.isTensor()) return {output.toTensor()};
  std::vector<torch::Tensor> tensors;
  auto add = [&](const c10::IValue& value) {
    if (!value.isTensor()) throw Error(fmt::format("model output holds a {}, not a tensor", value.tagKind()));
    tensors.push_back(value.toTensor());
  };
  if (output.isTuple()) {
    for (const auto& element : output.toTupleRef().elements()) add(element);
  } else if (output.isList()) {
    for (const auto& element : output.toListRef()) add(element);
  } else {
    throw Error(fmt::format("model returns a {}, not tensors", output.tagKind()));
  }
  return tensors;
}

namespace {

std::vector<torch::Tensor> run(torch::jit::Module& model, const std::vector<torch::Tensor>& inputs, const char* which) {
  try {
    return output_tensors(model.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())));
  } catch (const Error& e) {
    throw Error(fmt::format("verify: the {} {}", which, e.what()));
  }
}

// Sums over one chunk into the running agreement of one output.
struct OutputTally {
  Agreement agreement;
  int64_t positions = 0;  // argmaxes compared
  int64_t agreeing = 0;

  void add(const torch::Tensor& expected, const torch::Tensor& actual) {
    // A NaN must fail verification, and std::max would silently skip it.
    double diff = expected.numel() == 0 ? 0.0 : (expected - actual).abs().max().item<double>();
    if (!std::isfinite(diff)) diff = std::numeric_limits<double>::infinity();
    agreement.max_abs_diff = std::max(agreement.max_abs_diff, diff);
    if (expected.numel() > 0) {
      agreement.max_abs_expected = std::max(agreement.max_abs_expected, expected.abs().max().item<double>());
    }
    agreement.samples += expected.size(0);
    if (expected.dim() >= 2 && expected.size(-1) > 0) {
      const auto same = expected.argmax(-1).eq(actual.argmax(-1));
      positions += same.numel();
      agreeing += same.sum().item<int64_t>();
    }
  }

  Agreement result() const {
    Agreement out = agreement;
    if (positions > 0) out.top1_agreement = static_cast<double>(agreeing) / static_cast<double>(positions);
    return out;
  }
};

}  // namespace

std::vector<Agreement> verify_outputs(torch::jit::Module& original, torch::jit::Module& optimized,
                                      const std::vector<torch::Tensor>& inputs, int64_t batch_size) {
  if (inputs.empty()) throw Error("verify: no inputs");
  c10::InferenceMode inference;
  std::vector<OutputTally> tallies;
  for (int64_t start = 0; start < inputs[0].size(0); start += batch_size) {
    std::vector<torch::Tensor> chunk;
    for (const auto& input : inputs) chunk.push_back(input.slice(0, start, start + batch_size));
    const auto expected = run(original, chunk, "original");
    const auto actual = run(optimized, chunk, "optimized");
    if (expected.size() != actual.size()) {
      throw Error(fmt::format("verify: the original model returns {} outputs, the optimized one {}", expected.size(),
                              actual.size()));
    }
    tallies.resize(expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      if (expected[i].sizes() != actual[i].sizes()) {
        throw Error(fmt::format("verify: output shapes differ{}: original {} vs optimized {}",
                                expected.size() > 1 ? fmt::format(" (output {})", i) : "",
                                c10::str(expected[i].sizes()), c10::str(actual[i].sizes())));
      }
      tallies[i].add(expected[i].to(torch::kFloat), actual[i].to(torch::kFloat));
    }
  }
  std::vector<Agreement> agreements;
  for (const auto& tally : tallies) agreements.push_back(tally.result());
  return agreements;
}

Agreement verify(torch::jit::Module& original, torch::jit::Module& optimized, const torch::Tensor& inputs,
                 int64_t batch_size) {
  return worst(verify_outputs(original, optimized, {inputs}, batch_size));
}

}  // namespace afterburner::infer
