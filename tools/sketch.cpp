// afterburner sketch: replace a TorchScript model's Linear and Conv2d layers by sketched ones
// (SKLinear, SKConv2d) initialised from their weights, and its nn.MultiheadAttention by
// random-feature attention with the same weights, and write TorchScript Python can load; or,
// with --tune, find the fastest sketch of a model (zoo or file) that trains to a target accuracy.
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/sketch/script.h"
#include "afterburner/train/interrupt.h"
#include "afterburner/tune/sketch_tune.h"
#include "commands.h"
#include "config_options.h"

namespace afterburner::tools {
namespace {

struct SketchArgs {
  std::string input;
  std::string output;
  std::vector<int64_t> terms;  // L: one, or with --tune the L searched
  std::vector<int64_t> ranks;  // k: one, or with --tune the k searched
  double budget = 0;
  std::string layers;          // per-layer sketches, "fc1=2:32,fc2=keep"
  std::vector<int64_t> attention_features;  // one m, or with --tune the m searched
  std::string attention_kernel = "softmax";
  bool tune = false;
  bool per_layer = true;
  double time_budget = 600;
  int64_t inference_batch = 64;
  double measure_seconds = 0.5;
  std::optional<double> max_accuracy_drop;
  std::string plan;
  std::string frontier;
};

// "mlp-sketched.pt" -> "mlp-sketched.<suffix>"
std::string beside(const std::string& output, const std::string& suffix) {
  const auto dot = output.rfind('.');
  const auto slash = output.rfind('/');
  const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (has_extension ? output.substr(0, dot) : output) + "." + suffix;
}

int run_tune(const SketchArgs& args, const train::TrainConfig& recipe) {
  if (!args.input.empty()) {
    throw UsageError("sketch --tune", "takes the model as --model (a zoo model or a file), not as '" + args.input + "'");
  }
  const std::string plan = args.plan.empty() ? beside(args.output, "plan.toml") : args.plan;
  const std::string frontier = args.frontier.empty() ? beside(args.output, "frontier.svg") : args.frontier;
  for (const auto& [path, flag] : {std::pair{args.output, "-o"}, {plan, "--plan"}, {frontier, "--frontier"}}) {
    check_writable(path, flag);
  }
  train::StopOnInterrupt stop_on_ctrl_c;  // ends the training in progress; what was trained is kept
  tune::SketchTuneOptions options;
  options.target_accuracy(recipe.target_accuracy)
      .max_accuracy_drop(args.max_accuracy_drop)
      .time_budget(args.time_budget)
      .batch_size(args.inference_batch)
      .measure_seconds(args.measure_seconds)
      .attention_kernel(sketch::parse_feature_kernel(args.attention_kernel))
      .stop(&train::interrupt_requested())
      .log([](const std::string& line) { std::cout << "sketch --tune: " << line << std::endl; });
  if (!args.attention_features.empty()) options.attention_features(args.attention_features);
  if (!args.terms.empty()) options.terms(args.terms);
  if (!args.ranks.empty()) options.ranks(args.ranks);
  options.per_layer(args.per_layer);
  const auto result = tune::tune_sketch(recipe, options);
  std::cout << tune::format_sketch_table(result);
  if (!result.chosen) {
    if (result.interrupted) {
      std::cerr << "afterburner: sketch --tune interrupted before a plan reached the target; nothing written\n";
      return 130;
    }
    throw Error(tune::no_plan_message(result) + "; nothing written");
  }
  tune::write_sketch_outputs(result, args.output, plan, frontier);
  std::cout << "wrote " << args.output << ", " << plan << " and " << frontier << "\n";
  return result.interrupted ? 130 : 0;
}

int run_sketch(const SketchArgs& args) {
  if (args.input.empty()) throw UsageError("sketch", "needs the TorchScript model to sketch (or --tune --model NAME)");
  for (const auto& [flag, values] : {std::pair{"--attention-features", &args.attention_features},
                                     {"--terms", &args.terms}, {"--rank", &args.ranks}}) {
    if (values->size() > 1) throw UsageError(flag, "takes one number (a list with --tune only)");
  }
  const auto config = sketch::SketchConfig()
                          .terms(args.terms.empty() ? 1 : args.terms[0])
                          .rank(args.ranks.empty() ? 0 : args.ranks[0])
                          .budget(args.budget)
                          .layers(sketch::parse_layer_sketches(args.layers, "--layers"))
                          .attention_features(args.attention_features.empty() ? 0 : args.attention_features[0])
                          .attention_kernel(sketch::parse_feature_kernel(args.attention_kernel));
  sketch::check_config(config);
  torch::jit::Module model = infer::load_model(args.input);
  const auto report = sketch::sketch_script(model, config);
  for (const auto& layer : report.layers) std::cout << sketch::describe(layer) << "\n";
  if (report.layers.empty()) {
    throw Error(args.input + ": no Linear, Conv2d or MultiheadAttention submodule to sketch (a frozen model, as "
                             "`afterburner optimize` writes, has none: sketch before optimizing); nothing written");
  }
  if (report.replaced_count() == 0) {
    throw Error(args.input + ": no layer was sketched (" + std::to_string(report.layers.size()) +
                " Linear, Conv2d or MultiheadAttention layers found); nothing written");
  }
  std::cout << sketch::describe(report) << "\n";
  infer::save_model(model, args.output);
  std::cout << "wrote " << args.output << "\n";
  return 0;
}

}  // namespace

Command add_sketch_command(CLI::App& app) {
  auto* sub = app.add_subcommand("sketch", "replace a TorchScript model's Linear and Conv2d layers by sketched "
                                           "low-rank ones initialised from their weights, and its attention by "
                                           "random-feature attention");
  auto args = std::make_shared<SketchArgs>();
  sub->add_option("input", args->input, "TorchScript model (torch.jit.save or afterburner train --export)");
  sub->add_option("-o,--output", args->output, "where to write the sketched model")->required();
  sub->add_option("--terms", args->terms,
                  "sketched terms per layer (L, default 1); with --tune, the L searched, comma-separated (default 1,2)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  sub->add_option("--rank", args->ranks,
                  "rank of each term (k), the same for every layer; with --tune, the k searched, comma-separated "
                  "(default 8,16,32,64,128,256)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  auto* budget = sub->add_option("--budget", args->budget,
                                 "instead of --rank: the largest rank whose weights stay within this fraction "
                                 "of each layer's, in (0, 1)");
  auto* layers = sub->add_option("--layers", args->layers,
                                 "per-layer sketches overriding --rank/--budget/--attention-features: NAME=L:k, "
                                 "NAME=m:M (an attention) or NAME=keep, comma-separated (names as this command "
                                 "prints them)");
  auto* features = sub->add_option("--attention-features", args->attention_features,
                                   "random features per head (m) in place of each nn.MultiheadAttention's softmax "
                                   "(Performer's FAVOR+, the same weights); without it attention stays exact; with "
                                   "--tune, the m searched, comma-separated (default 32,64,128)")
                       ->delimiter(',')
                       ->check(CLI::PositiveNumber);
  sub->add_option("--attention-kernel", args->attention_kernel, "--attention-features: the feature map")
      ->check(CLI::IsMember({"softmax", "relu"}))
      ->capture_default_str()
      ->needs(features);
  // --tune trains: the training options apply (--model, --data, --epochs, --target-accuracy, ...),
  // but not those that write train's outputs or choose a sketch themselves.
  auto* tune = sub->add_flag("--tune", args->tune,
                             "train sketched plans of a model (--model: a zoo model or a TorchScript file, whose "
                             "attention is searched too) and write the fastest at inference whose validation "
                             "accuracy reaches --target-accuracy, its plan (TOML) and its frontier (SVG)");
  tune->excludes(budget)->excludes(layers);
  sub->add_flag("!--no-per-layer", args->per_layer,
                "--tune: keep every layer at the model-wide (L, k) chosen, without stepping single layers' ranks down")
      ->needs(tune);
  sub->add_option("--time-budget", args->time_budget, "--tune: seconds for all its training runs, roughly")
      ->capture_default_str()
      ->needs(tune);
  sub->add_option("--inference-batch", args->inference_batch, "--tune: the batch size speeds are measured at")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->needs(tune);
  sub->add_option("--max-accuracy-drop", args->max_accuracy_drop,
                  "--tune, instead of --target-accuracy: how far below the dense model's validation accuracy "
                  "(trained with the same recipe) a plan may fall, e.g. 0.01")
      ->needs(tune);
  sub->add_option("--measure-seconds", args->measure_seconds, "--tune: seconds each model's speed is measured for")
      ->check(CLI::PositiveNumber)
      ->capture_default_str()
      ->needs(tune);
  sub->add_option("--plan", args->plan, "--tune: where to write the plan (default: beside -o, .plan.toml)")->needs(tune);
  sub->add_option("--frontier", args->frontier, "--tune: where to write the frontier (default: beside -o, .frontier.svg)")
      ->needs(tune);
  auto recipe = std::make_shared<ConfigOptions>(
      sub, train::TrainConfig{},
      std::set<std::string>{"report", "dashboard", "export", "log_jsonl", "checkpoint_dir", "checkpoint_every", "resume",
                            "trace", "profile", "progress", "sketch", "sketch_terms", "sketch_rank", "sketch_budget", "sketch_layers",
                            "nproc", "nnodes", "node_rank", "master_addr", "master_port", "dist_timeout"});
  return {sub, [args, recipe] {
            if (args->tune) return run_tune(*args, recipe->resolve());
            if (const std::string flag = recipe->first_given(); !flag.empty()) {
              throw UsageError(flag, "is a training option: it applies to sketch --tune only");
            }
            return run_sketch(*args);
          }};
}

}  // namespace afterburner::tools
