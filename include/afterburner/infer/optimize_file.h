// The whole `afterburner optimize` flow as one call: load a TorchScript file, optimize it,
// verify the result as it will run (after prepare_for_inference) against the original, write
// it only when it agrees within the tolerance (or when forced), then measure both.
//
//   namespace infer = afterburner::infer;
//   auto report = infer::optimize_file("cnn.pt", "cnn-bf16.pt",
//                                      infer::OptimizeFileOptions().precision(infer::Precision::bf16));
//   std::cout << infer::describe(report.agreement) << "\n";     // throws instead when it disagrees
//   std::cout << infer::describe(report.after.best()) << "\n";
//
//   // A model with several inputs, or token ids: verify and measure on examples Python saved with
//   // torch.save((images, features), "examples.pt").
//   infer::optimize_file("two.pt", "two-opt.pt", infer::OptimizeFileOptions().example_inputs("examples.pt"));
//
//   // A large model: a second per batch size and model, each batch size shown as it is measured.
//   infer::optimize_file("resnet18.pt", "resnet18-opt.pt",
//                        infer::OptimizeFileOptions().input_shape({3, 224, 224}).batch_sizes({1, 16, 64})
//                            .measure_seconds(1).on_progress([](const infer::OptimizeFileProgress& progress) {
//                              if (progress.measured) std::cout << infer::describe(*progress.measured) << "\n";
//                            }));
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "afterburner/infer/measure.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/infer/verify.h"

namespace afterburner::infer {

struct OptimizeFileReport;
struct OptimizeFileProgress;

struct OptimizeFileOptions {
  TORCH_ARG(Precision, precision) = Precision::fp32;
  // One sample's shape, without the batch dimension, for a model with one float input.
  TORCH_ARG(std::vector<int64_t>, input_shape) = std::vector<int64_t>{1, 28, 28};
  // A file Python's torch.save wrote: a tensor, or a tuple or list of tensors, one per forward
  // argument, batch dimension first, the same number of rows each. Verification and measurement
  // then run on these rows instead of images or random inputs (input_shape and data unused):
  // what a model with several inputs, or with non-float ones such as token ids, needs.
  TORCH_ARG(std::string, example_inputs);
  // A Fashion-MNIST directory to verify on its test images; empty: the system's copy when the
  // shape is 1x28x28 and it is installed, else random inputs.
  TORCH_ARG(std::string, data);
  // Unset: default_tolerance(precision).
  TORCH_ARG(std::optional<Tolerance>, tolerance);
  // Write even when verification fails (the report says it did).
  TORCH_ARG(bool, force) = false;
  // Verification runs on as many of the random inputs or Fashion-MNIST images as the original
  // and the optimized model get through in about this time (from the original's cost per sample
  // on a few rows), and on at least kMinVerifiedSamples: 512 random 3x224x224 inputs took
  // ResNet-18 half a minute. Example inputs are verified on all their rows.
  TORCH_ARG(double, verify_seconds) = 10;
  // Timing budget per batch size and model, warm-up included (MeasureOptions); 0 skips the
  // measurement.
  TORCH_ARG(double, measure_seconds) = MeasureOptions().seconds_per_batch_size();
  TORCH_ARG(std::vector<int64_t>, batch_sizes) = MeasureOptions().batch_sizes();
  // Called as the flow goes (see OptimizeFileProgress), so that a caller can show a large
  // model's minutes of verification and measurement as they pass.
  TORCH_ARG(std::function<void(const OptimizeFileProgress&)>, on_progress) = nullptr;
};

constexpr int64_t kMinVerifiedSamples = 16;

struct OptimizeFileReport {
  std::vector<std::string> passes;  // one line per pass
  std::string verified_on;          // "10000 Fashion-MNIST test images from DIR", "512 random inputs",
                                    // "64 example inputs from FILE", "90 random inputs (of 512: ...)"
  std::vector<Agreement> outputs;   // one per model output (a tuple's elements)
  Agreement agreement;              // the worst over outputs
  Tolerance tolerance;
  bool agrees = true;               // false only when forced past a failed verification
  Speed before, after;              // empty when measure_seconds is 0
};

// Where optimize_file has got to.
struct OptimizeFileProgress {
  enum class Step {
    verifying,         // about to verify on report.verified_on
    written,           // verified and written: passes, outputs, agreement and agrees are set
    measuring_before,  // the original model's speed: once with measured unset as it starts, then
    measuring_after,   // once per batch size as measured; likewise the optimized model's
  };
  Step step;
  const OptimizeFileReport& report;    // filled as far as the flow has got
  const SpeedPoint* measured = nullptr;
};

// Verification and measurement feed random inputs of options.input_shape(), the Fashion-MNIST
// test images or the example inputs, as options say. Throws ModelError naming a file that cannot be read or written, DataError naming an example
// inputs file that cannot be read or does not fit the model, UsageError for bad options (and
// "example_inputs" for a model random inputs cannot feed: several inputs), Error "<input>: the
// model fails on <inputs>: <reason>" when the original model cannot run on the verification
// inputs, and Error "<output>: not written, verification failed: ..." when the result disagrees
// and force is off: nothing is written then. Every message is one line.
OptimizeFileReport optimize_file(const std::string& input, const std::string& output,
                                 const OptimizeFileOptions& options = {});

}  // namespace afterburner::infer
