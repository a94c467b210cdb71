#include "afterburner/infer/optimize_file.h"

#include <fmt/format.h>

#include <filesystem>

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
  torch::Tensor images;
  std::string description;
};

// Real images where the model takes Fashion-MNIST ones, random ones otherwise: agreement on
// real data is what users care about.
VerificationInputs verification_inputs(const OptimizeFileOptions& options) {
  const auto& shape = options.input_shape();
  const bool mnist_shape = shape == std::vector<int64_t>{1, 28, 28};
  std::string dir = options.data();
  if (dir.empty() && mnist_shape && std::filesystem::is_directory(kFashionMnistDir)) dir = kFashionMnistDir;
  if (!dir.empty()) {
    if (!mnist_shape) throw UsageError("data", "Fashion-MNIST verification needs the input shape 1,28,28");
    auto test = data::load_mnist(dir, data::Split::test);
    auto images = test->get_batch(torch::arange(test->size())).input;
    return {(images.to(torch::kFloat) / 255.0 - kFashionMnistMean) / kFashionMnistStd,
            fmt::format("{} Fashion-MNIST test images from {}", images.size(0), dir)};
  }
  std::vector<int64_t> batch_shape{kRandomSamples};
  batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
  return {torch::randn(batch_shape), fmt::format("{} random inputs", kRandomSamples)};
}

}  // namespace

OptimizeFileReport optimize_file(const std::string& input, const std::string& output,
                                 const OptimizeFileOptions& options) {
  OptimizeFileReport report;
  report.tolerance = options.tolerance().value_or(default_tolerance(options.precision()));
  torch::manual_seed(0);
  auto original = load_model(input);
  original.eval();  // saved in training mode, its dropout would make verification a coin toss
  const VerificationInputs inputs = verification_inputs(options);
  report.verified_on = inputs.description;
  auto result = optimize(original, OptimizeOptions().precision(options.precision()));
  report.passes = result.passes;

  auto prepared = prepare_for_inference(result.model);  // verified as it will run
  report.agreement = verify(original, prepared, inputs.images);
  report.agrees = within(report.agreement, report.tolerance);
  if (!report.agrees && !options.force()) {
    throw Error(fmt::format("{}: not written, verification failed: {} (tolerance: max abs diff {:g}, top-1 "
                            "agreement {:.2f}%); --force writes it anyway",
                            output, describe(report.agreement), report.tolerance.max_abs_diff(),
                            100.0 * report.tolerance.min_top1_agreement()));
  }
  save_model(result.model, output);

  if (options.measure_seconds() > 0) {
    const auto measuring = MeasureOptions().seconds_per_batch_size(options.measure_seconds());
    report.before = measure(original, options.input_shape(), measuring);
    auto deployed = load_optimized(output);
    report.after = measure(deployed, options.input_shape(), measuring);
  }
  return report;
}

}  // namespace afterburner::infer
