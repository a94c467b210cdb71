// afterburner optimize: freeze and rewrite a TorchScript model for CPU inference, verify it
// against the original, and report its speed before and after.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "afterburner/core/error.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/threads.h"
#include "afterburner/data/idx.h"
#include "afterburner/infer/measure.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "commands.h"

namespace afterburner::tools {
namespace {

const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr int64_t kRandomSamples = 512;

struct OptimizeArgs {
  std::string input;
  std::string output;
  std::string precision = "fp32";
  std::string input_shape = "1,28,28";
  std::string data;
  double tolerance = -1;      // < 0: the precision's default
  double min_agreement = -1;  // < 0: the precision's default
  bool force = false;
  int threads = 0;
  double measure_seconds = infer::MeasureOptions().seconds_per_batch_size();
};

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    size_t used = 0;
    int64_t size = 0;
    try {
      size = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || size < 1) {
      throw UsageError("--input-shape", "'" + text + "' is not a comma-separated list of positive sizes");
    }
    shape.push_back(size);
  }
  if (shape.empty()) throw UsageError("--input-shape", "is empty");
  return shape;
}

// Real images where the model takes Fashion-MNIST ones (normalized as training does), random
// ones otherwise: agreement on real data is what users care about.
torch::Tensor verification_inputs(const OptimizeArgs& args, const std::vector<int64_t>& shape) {
  const bool mnist_shape = shape == std::vector<int64_t>{1, 28, 28};
  std::string dir = args.data;
  if (dir.empty() && mnist_shape && std::filesystem::is_directory(kFashionMnistDir)) dir = kFashionMnistDir;
  if (!dir.empty()) {
    if (!mnist_shape) throw UsageError("--data", "needs --input-shape 1,28,28");
    auto test = data::load_mnist(dir, data::Split::test);
    auto images = test->get_batch(torch::arange(test->size())).input;
    std::cout << fmt::format("verifying on {} Fashion-MNIST test images from {}\n", images.size(0), dir);
    return (images.to(torch::kFloat) / 255.0 - 0.2860) / 0.3530;
  }
  std::vector<int64_t> batch_shape{kRandomSamples};
  batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
  std::cout << fmt::format("verifying on {} random inputs\n", kRandomSamples);
  return torch::randn(batch_shape, torch::TensorOptions().dtype(torch::kFloat));
}

void print_speed(const std::string& label, const infer::Speed& speed) {
  std::cout << label << "\n";
  for (const auto& point : speed.points) std::cout << "  " << infer::describe(point) << "\n";
}

infer::Tolerance tolerance_for(const OptimizeArgs& args, infer::Precision precision) {
  auto tolerance = infer::default_tolerance(precision);
  if (args.tolerance >= 0) tolerance.max_abs_diff(args.tolerance);
  if (args.min_agreement >= 0) tolerance.min_top1_agreement(args.min_agreement);
  return tolerance;
}

// Throws (nothing gets written) when the optimized model disagrees beyond the tolerance,
// unless --force.
void refuse_unless_within(const OptimizeArgs& args, const infer::Agreement& agreement,
                          const infer::Tolerance& tolerance) {
  if (infer::within(agreement, tolerance)) return;
  const auto problem =
      fmt::format("verification failed: {} (tolerance: max abs diff {:g}, top-1 agreement {:.2f}%)",
                  infer::describe(agreement), tolerance.max_abs_diff(), 100.0 * tolerance.min_top1_agreement());
  if (!args.force) throw Error(args.output + ": not written, " + problem + "; --force writes it anyway");
  std::cerr << "afterburner: " << problem << "; writing anyway (--force)\n";
}

void report_speed(const OptimizeArgs& args, torch::jit::Module& original, const std::vector<int64_t>& shape) {
  const auto measuring = infer::MeasureOptions().seconds_per_batch_size(args.measure_seconds);
  print_speed("before (original, TorchScript as loaded):", infer::measure(original, shape, measuring));
  auto deployed = infer::load_optimized(args.output);
  const auto after = infer::measure(deployed, shape, measuring);
  print_speed("after (" + args.precision + ", as infer::load_optimized runs it):", after);
  std::cout << fmt::format("best batch size after: {}\n", after.best().batch_size);
}

int run_optimize(const OptimizeArgs& args) {
  const auto precision = infer::parse_precision(args.precision);
  const auto shape = parse_shape(args.input_shape);
  const auto tolerance = tolerance_for(args, precision);
  ThreadsGuard threads(args.threads > 0 ? args.threads : available_cores());
  // Inference allocates the same activations call after call: served from the heap rather than
  // fresh zero-filled mappings, bf16 cnn batches run about 3x faster (before and after alike).
  keep_freed_memory();
  torch::manual_seed(0);

  auto original = infer::load_model(args.input);
  original.eval();  // saved in training mode, its dropout would make verification a coin toss
  auto inputs = verification_inputs(args, shape);
  auto result = infer::optimize(original, infer::OptimizeOptions().precision(precision));
  std::cout << "passes:\n";
  for (const auto& pass : result.passes) std::cout << "  " << pass << "\n";

  // Verified as it will run: loaded, then laid out for oneDNN.
  auto prepared = infer::prepare_for_inference(result.model);
  const auto agreement = infer::verify(original, prepared, inputs);
  std::cout << "agreement: " << infer::describe(agreement) << "\n";
  refuse_unless_within(args, agreement, tolerance);
  infer::save_model(result.model, args.output);
  std::cout << "wrote " << args.output << "\n";
  report_speed(args, original, shape);
  return 0;
}

// "1e-3 fp32, 0.5 bf16, 1 int8" for one field of the default tolerances.
template <typename Field>
std::string default_per_precision(Field field) {
  std::vector<std::string> parts;
  for (auto precision : {infer::Precision::fp32, infer::Precision::bf16, infer::Precision::int8}) {
    parts.push_back(fmt::format("{:g} {}", field(infer::default_tolerance(precision)), infer::to_string(precision)));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

Command add_optimize_command(CLI::App& app) {
  auto* sub = app.add_subcommand("optimize", "optimize a TorchScript model for CPU inference, verify it "
                                             "against the original and measure both");
  auto args = std::make_shared<OptimizeArgs>();
  sub->add_option("input", args->input, "TorchScript model (torch.jit.save or afterburner train --export)")
      ->required();
  sub->add_option("-o,--output", args->output, "where to write the optimized model")->required();
  sub->add_option("--precision", args->precision, "fp32, bf16 or int8 (int8: Linear layers)")
      ->capture_default_str();
  sub->add_option("--input-shape", args->input_shape, "one sample's shape, without the batch dimension")
      ->capture_default_str();
  sub->add_option("--data", args->data,
                  fmt::format("Fashion-MNIST directory for verification on real images (default {} "
                              "when the shape is 1,28,28)",
                              kFashionMnistDir));
  sub->add_option("--tolerance", args->tolerance,
                  "largest max abs output difference accepted (default: " +
                      default_per_precision([](const infer::Tolerance& t) { return t.max_abs_diff(); }) + ")")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--min-agreement", args->min_agreement,
                  "smallest top-1 agreement accepted, 0..1 (default: " +
                      default_per_precision([](const infer::Tolerance& t) { return t.min_top1_agreement(); }) +
                      ")")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--force", args->force, "write the model even when verification fails");
  sub->add_option("--threads", args->threads, "intra-op threads (default: all available cores)");
  sub->add_option("--measure-seconds", args->measure_seconds, "timing per batch size and model")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return {sub, [args] { return run_optimize(*args); }};
}

}  // namespace afterburner::tools
