// afterburner optimize: freeze and rewrite a TorchScript model for CPU inference, verify it
// against the original, and report its speed before and after.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>
#include <sstream>

#include "afterburner/core/error.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/threads.h"
#include "afterburner/infer/measure.h"
#include "afterburner/infer/optimize_file.h"
#include "commands.h"
#include "options.h"

namespace afterburner::tools {
namespace {

struct OptimizeArgs {
  std::string input;
  std::string output;
  std::string precision = "fp32";
  std::string input_shape = "1,28,28";
  std::string data;
  std::string example_inputs;
  double tolerance = -1;      // < 0: the precision's default
  double relative_tolerance = -1;
  double min_agreement = -1;  // < 0: the precision's default
  bool force = false;
  int threads = 0;
  double measure_seconds = infer::MeasureOptions().seconds_per_batch_size();
  std::vector<int64_t> batch_sizes = infer::MeasureOptions().batch_sizes();
  double verify_seconds = infer::OptimizeFileOptions().verify_seconds();
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

infer::OptimizeFileOptions file_options(const OptimizeArgs& args) {
  const auto precision = infer::parse_precision(args.precision);
  auto tolerance = infer::default_tolerance(precision);
  // A --tolerance given is the whole bound unless --relative-tolerance is given too.
  if (args.tolerance >= 0) tolerance.max_abs_diff(args.tolerance).relative(0);
  if (args.relative_tolerance >= 0) tolerance.relative(args.relative_tolerance);
  if (args.min_agreement >= 0) tolerance.min_top1_agreement(args.min_agreement);
  return infer::OptimizeFileOptions()
      .precision(precision)
      .input_shape(parse_shape(args.input_shape))
      .data(args.data)
      .example_inputs(args.example_inputs)
      .tolerance(tolerance)
      .force(args.force)
      .verify_seconds(args.verify_seconds)
      .measure_seconds(args.measure_seconds)
      .batch_sizes(args.batch_sizes);
}

void print_verified(const infer::OptimizeFileReport& report, const std::string& output) {
  std::cout << "passes:\n";
  for (const auto& pass : report.passes) std::cout << "  " << pass << "\n";
  if (report.outputs.size() == 1) {
    std::cout << "agreement: " << infer::describe(report.agreement) << "\n";
  } else {
    std::cout << fmt::format("agreement (worst of {} outputs): {}\n", report.outputs.size(),
                             infer::describe(report.agreement));
    for (size_t i = 0; i < report.outputs.size(); ++i) {
      std::cout << fmt::format("  output {}: {}\n", i, infer::describe(report.outputs[i]));
    }
  }
  if (!report.agrees) {
    std::cerr << fmt::format("afterburner: verification failed (tolerance: {}); writing anyway (--force)\n",
                             infer::describe(report.tolerance));
  }
  std::cout << "wrote " << output << "\n";
}

// Each step as it happens, flushed: a 224x224 model takes a minute, and a pipe would otherwise
// hold every line until the end.
void print_progress(const infer::OptimizeFileProgress& progress, const OptimizeArgs& args) {
  using Step = infer::OptimizeFileProgress::Step;
  if (progress.measured) {
    std::cout << "  " << infer::describe(*progress.measured) << std::endl;
    return;
  }
  switch (progress.step) {
    case Step::verifying: std::cout << "verifying on " << progress.report.verified_on << "\n"; break;
    case Step::written: print_verified(progress.report, args.output); break;
    case Step::measuring_before: std::cout << "before (original, TorchScript as loaded):\n"; break;
    case Step::measuring_after: std::cout << "after (" << args.precision << ", as infer::load_optimized runs it):\n"; break;
  }
  std::cout << std::flush;
}

int run_optimize(const OptimizeArgs& args) {
  const auto options =
      file_options(args).on_progress([&args](const infer::OptimizeFileProgress& p) { print_progress(p, args); });
  ThreadsGuard threads(args.threads > 0 ? args.threads : available_cores());
  // Inference allocates the same activations call after call: keep them in the heap (core/heap.h),
  // for the timings before and after alike.
  keep_freed_memory();
  const auto report = infer::optimize_file(args.input, args.output, options);
  if (report.after.points.empty()) return 0;
  std::cout << fmt::format("best batch size after: {}\n", report.after.best().batch_size);
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
  auto* input_shape =
      sub->add_option("--input-shape", args->input_shape,
                      "one sample's shape, without the batch dimension (random inputs, models with one float input)")
          ->capture_default_str();
  auto* data = sub->add_option("--data", args->data,
                               "Fashion-MNIST directory for verification on real images (default: the system's copy "
                               "when the shape is 1,28,28)");
  sub->add_option("--example-inputs", args->example_inputs,
                  "verify and measure on these inputs: a file torch.save wrote, a tensor or a tuple of tensors (one "
                  "per forward argument, batch dimension first); needed for several or non-float inputs")
      ->excludes(input_shape)
      ->excludes(data);
  sub->add_option("--tolerance", args->tolerance,
                  "largest max abs output difference accepted (default: " +
                      default_per_precision([](const infer::Tolerance& t) { return t.max_abs_diff(); }) + ")")
      ->check(kNonNegative);
  sub->add_option("--relative-tolerance", args->relative_tolerance,
                  "added to --tolerance, as a fraction of the largest original output's magnitude (default: 0 with "
                  "--tolerance, else " +
                      default_per_precision([](const infer::Tolerance& t) { return t.relative(); }) + ")")
      ->check(kNonNegative);
  sub->add_option("--min-agreement", args->min_agreement,
                  "smallest top-1 agreement accepted, 0..1 (default: " +
                      default_per_precision([](const infer::Tolerance& t) { return t.min_top1_agreement(); }) +
                      ")")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--force", args->force, "write the model even when verification fails");
  sub->add_option("--threads", args->threads, "intra-op threads (default: all available cores)");
  sub->add_option("--verify-seconds", args->verify_seconds,
                  "verify on as many inputs as the original and optimized models get through in about this time "
                  "(at least " + std::to_string(infer::kMinVerifiedSamples) + ")")
      ->capture_default_str()
      ->check(kPositive);
  sub->add_option("--measure-seconds", args->measure_seconds,
                  "timing budget per batch size and model, warm-up included; a batch size whose call takes longer "
                  "gets one untimed and one timed call (0: no timing)")
      ->capture_default_str()
      ->check(kNonNegative);
  add_list_option(sub, "--batch-sizes", args->batch_sizes, "batch sizes to measure");
  return {sub, [args] { return run_optimize(*args); }};
}

}  // namespace afterburner::tools
