#include "afterburner/infer/optimize_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "afterburner/core/archive.h"
#include "afterburner/core/error.h"
#include "afterburner/data/idx.h"
#include "afterburner/infer/model_file.h"

namespace afterburner::infer {
namespace {

const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kRandomSamples = 512;
// Fashion-MNIST's training-set pixel mean and standard deviation (of values / 255): what
// `afterburner train` normalizes by, so exported models see the inputs they were trained on.
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

struct VerificationInputs {
  std::vector<torch::Tensor> tensors;  // one per forward argument, [N, ...]
  std::string description;
};

std::vector<std::string> forward_arguments(const torch::jit::Module& model) {
  std::vector<std::string> names;
  const auto& arguments = model.get_method("forward").function().getSchema().arguments();
  for (size_t i = 1; i < arguments.size(); ++i) names.push_back(arguments[i].name());  // after self
  return names;
}

std::string shapes(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::string> each;
  for (const auto& tensor : tensors) each.push_back(c10::str(tensor.sizes()));
  return fmt::format("{}", fmt::join(each, " and "));
}

// The tensors of a torch.save file: a tensor, or a tuple or list of tensors sharing their rows.
std::vector<torch::Tensor> load_example_inputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot read the example inputs");
  try {
    check_archive(path);
  } catch (const ArchiveError& e) {
    throw DataError(path, "not a file of tensors as torch.save writes it (" + e.problem() + ")");
  }
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw DataError(path, "not a file of tensors as torch.save writes it (" + first_line(e) + ")");
  }
  std::vector<c10::IValue> elements{value};
  if (value.isTuple()) elements = value.toTupleRef().elements().vec();
  if (value.isList()) elements = value.toListRef().vec();
  std::vector<torch::Tensor> tensors;
  for (const auto& element : elements) {
    if (!element.isTensor()) {
      throw DataError(path, fmt::format("holds a {}: example inputs are a tensor, or a tuple or list of tensors",
                                        element.tagKind()));
    }
    tensors.push_back(element.toTensor());
  }
  if (tensors.empty()) throw DataError(path, "holds no tensors");
  for (const auto& tensor : tensors) {
    if (tensor.dim() == 0 || tensor.size(0) < 1 || tensor.size(0) != tensors[0].size(0)) {
      throw DataError(path, "example inputs need the same number of rows, at least one, batch dimension first: got " +
                                shapes(tensors));
    }
  }
  return tensors;
}

// The user's examples if given; else real images where the model takes Fashion-MNIST ones,
// random ones otherwise: agreement on real data is what users care about.
VerificationInputs verification_inputs(const std::string& input, const torch::jit::Module& model,
                                       const OptimizeFileOptions& options) {
  const auto arguments = forward_arguments(model);
  if (!options.example_inputs().empty()) {
    auto tensors = load_example_inputs(options.example_inputs());
    if (tensors.size() != arguments.size()) {
      throw DataError(options.example_inputs(),
                      fmt::format("holds {} example inputs, {}'s forward takes {} ({})", tensors.size(), input,
                                  arguments.size(), fmt::join(arguments, ", ")));
    }
    return {tensors, fmt::format("{} example inputs from {}", tensors[0].size(0), options.example_inputs())};
  }
  if (arguments.size() != 1) {
    throw UsageError("example_inputs",
                     fmt::format("{}'s forward takes {} inputs ({}) and random inputs of one shape feed one: give a "
                                 "file of example inputs (torch.save of a tuple of {} tensors, batch dimension first)",
                                 input, arguments.size(), fmt::join(arguments, ", "), arguments.size()));
  }
  const auto& shape = options.input_shape();
  const bool mnist_shape = shape == std::vector<int64_t>{1, 28, 28};
  std::string dir = options.data();
  if (dir.empty() && mnist_shape && std::filesystem::is_directory(kFashionMnistDir)) dir = kFashionMnistDir;
  if (!dir.empty()) {
    if (!mnist_shape) throw UsageError("data", "Fashion-MNIST verification needs the input shape 1,28,28");
    auto test = data::load_mnist(dir, data::Split::test);
    auto images = test->get_batch(torch::arange(test->size())).input;
    return {{(images.to(torch::kFloat) / 255.0 - kFashionMnistMean) / kFashionMnistStd},
            fmt::format("{} Fashion-MNIST test images from {}", images.size(0), dir)};
  }
  std::vector<int64_t> batch_shape{kRandomSamples};
  batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
  return {{torch::randn(batch_shape)}, fmt::format("{} random inputs", kRandomSamples)};
}

// A model that cannot run on the verification inputs (float inputs where it embeds token ids,
// the wrong shape) is the user's to fix: say so in one line before optimizing anything.
void check_runs_on(torch::jit::Module& model, const std::string& input, const VerificationInputs& inputs,
                   const OptimizeFileOptions& options) {
  std::vector<c10::IValue> first_rows;
  for (const auto& tensor : inputs.tensors) first_rows.emplace_back(tensor.slice(0, 0, 2));
  try {
    c10::InferenceMode inference;
    model.forward(first_rows);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: the model fails on {}: {}{}", input, inputs.description, first_line(e),
                            options.example_inputs().empty()
                                ? "; give inputs of the right shape and type as a file of example inputs"
                                : ""));
  }
}

// The faster of two calls of `model` on the first `rows` rows, in seconds.
double fastest_call(torch::jit::Module& model, const std::vector<torch::Tensor>& tensors, int64_t rows) {
  std::vector<c10::IValue> batch;
  for (const auto& tensor : tensors) batch.emplace_back(tensor.slice(0, 0, rows));
  c10::InferenceMode inference;
  double fastest = std::numeric_limits<double>::infinity();
  for (int call = 0; call < 2; ++call) {
    const auto start = std::chrono::steady_clock::now();
    model.forward(batch);
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return fastest;
}

// The original's seconds per sample, on 4 rows, then 4 times as many until a call takes long
// enough to time (a cheap model's few rows are all overhead and jitter) or all rows are used.
// Two calls each, after check_runs_on's first: TorchScript's profiling executor optimizes the
// graph during the second call, and the faster of two is the less disturbed.
double seconds_per_sample(torch::jit::Module& model, const std::vector<torch::Tensor>& tensors) {
  constexpr double kTimeable = 0.05;
  const int64_t all = tensors[0].size(0);
  int64_t rows = std::min<int64_t>(4, all);
  double seconds = fastest_call(model, tensors, rows);
  while (seconds < kTimeable && rows < all) {
    rows = std::min(4 * rows, all);
    seconds = fastest_call(model, tensors, rows);
  }
  return seconds / static_cast<double>(rows);
}

// The first rows of `inputs` that verification gets through in options.verify_seconds(), at
// least kMinVerifiedSamples: verification runs the original and the optimized model on each,
// about twice the original's cost (the optimized model is rarely slower). The user's example
// inputs are all kept: their number is the user's choice, and a top-1 agreement over fewer
// would turn one near tie into a failed verification.
VerificationInputs within_verify_time(torch::jit::Module& original, const VerificationInputs& inputs,
                                      const OptimizeFileOptions& options) {
  if (!options.example_inputs().empty()) return inputs;
  const int64_t rows = inputs.tensors[0].size(0);
  const double per_sample = seconds_per_sample(original, inputs.tensors);
  const double affordable = options.verify_seconds() / (2 * per_sample);
  const int64_t kept = affordable >= static_cast<double>(rows)
                           ? rows
                           : std::max(std::min(kMinVerifiedSamples, rows), static_cast<int64_t>(affordable));
  if (kept == rows) return inputs;
  VerificationInputs first;
  for (const auto& tensor : inputs.tensors) first.tensors.push_back(tensor.slice(0, 0, kept));
  first.description = fmt::format("{} of {} (what {:g} s of verification allows at {:.3g} ms a sample)", kept,
                                  inputs.description, options.verify_seconds(), 1000 * per_sample);
  return first;
}

void notify(const OptimizeFileOptions& options, OptimizeFileProgress::Step step, const OptimizeFileReport& report,
            const SpeedPoint* measured = nullptr) {
  if (options.on_progress()) options.on_progress()(OptimizeFileProgress{step, report, measured});
}

MeasureOptions measuring(const OptimizeFileOptions& options) {
  return MeasureOptions().batch_sizes(options.batch_sizes()).seconds_per_batch_size(options.measure_seconds());
}

// `model`'s speed on the verification inputs (all of them, not only those verified), each batch
// size reported as measured.
Speed measure_reporting(torch::jit::Module& model, const VerificationInputs& inputs, const OptimizeFileOptions& options,
                        OptimizeFileProgress::Step step, const OptimizeFileReport& report) {
  notify(options, step, report);
  return measure_inputs(model, inputs.tensors,
                        measuring(options).on_measured([&](const SpeedPoint& point) { notify(options, step, report, &point); }));
}

// Optimizes `original` and verifies it as it will run against the original on `inputs`, filling
// the report's passes and agreement.
OptimizeResult optimize_verified(const std::string& input, torch::jit::Module& original,
                                 const VerificationInputs& inputs, const OptimizeFileOptions& options,
                                 OptimizeFileReport& report) {
  OptimizeResult result;
  try {
    result = optimize(original, OptimizeOptions().precision(options.precision()));
    auto prepared = prepare_for_inference(result.model);  // verified as it will run
    report.outputs = verify_outputs(original, prepared, inputs.tensors);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", input, e.what()));
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: cannot optimize at {}: {}", input, to_string(options.precision()), first_line(e)));
  }
  report.passes = result.passes;
  report.agreement = worst(report.outputs);
  report.agrees = within(report.outputs, report.tolerance);
  return result;
}

}  // namespace

OptimizeFileReport optimize_file(const std::string& input, const std::string& output,
                                 const OptimizeFileOptions& options) {
  using Step = OptimizeFileProgress::Step;
  if (options.measure_seconds() > 0) check_measure_options(measuring(options));  // before minutes of work
  OptimizeFileReport report;
  report.tolerance = options.tolerance().value_or(default_tolerance(options.precision()));
  torch::manual_seed(0);
  auto original = load_model(input);
  original.eval();  // saved in training mode, its dropout would make verification a coin toss
  const VerificationInputs inputs = verification_inputs(input, original, options);
  check_runs_on(original, input, inputs, options);
  const VerificationInputs verified = within_verify_time(original, inputs, options);
  report.verified_on = verified.description;
  notify(options, Step::verifying, report);
  const OptimizeResult result = optimize_verified(input, original, verified, options, report);
  if (!report.agrees && !options.force()) {
    throw Error(fmt::format("{}: not written, verification failed: {} (tolerance: {}); --force writes it anyway",
                            output, describe(report.outputs), describe(report.tolerance)));
  }
  save_model(result.model, output, read_model_metadata(input));  // the class names and normalisation
  notify(options, Step::written, report);

  if (options.measure_seconds() > 0) {
    report.before = measure_reporting(original, inputs, options, Step::measuring_before, report);
    auto deployed = load_optimized(output);
    report.after = measure_reporting(deployed, inputs, options, Step::measuring_after, report);
  }
  return report;
}

}  // namespace afterburner::infer
