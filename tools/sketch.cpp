// afterburner sketch: replace a TorchScript model's Linear and Conv2d layers by sketched ones
// (SKLinear, SKConv2d) initialised from their weights, and write TorchScript Python can load.
#include <iostream>
#include <memory>

#include "afterburner/core/error.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/sketch/script.h"
#include "commands.h"

namespace afterburner::tools {
namespace {

struct SketchArgs {
  std::string input;
  std::string output;
  int64_t terms = 1;
  int64_t rank = 0;
  double budget = 0;
};

int run_sketch(const SketchArgs& args) {
  const auto config = sketch::SketchConfig().terms(args.terms).rank(args.rank).budget(args.budget);
  sketch::check_config(config);
  torch::jit::Module model = infer::load_model(args.input);
  const auto report = sketch::sketch_script(model, config);
  for (const auto& layer : report.layers) std::cout << sketch::describe(layer) << "\n";
  if (report.layers.empty()) {
    throw Error(args.input + ": no Linear or Conv2d submodule to sketch (a frozen model, as `afterburner optimize` "
                             "writes, has none: sketch before optimizing); nothing written");
  }
  if (report.replaced_count() == 0) {
    throw Error(args.input + ": no layer was sketched (" + std::to_string(report.layers.size()) +
                " Linear or Conv2d layers found); nothing written");
  }
  std::cout << sketch::describe(report) << "\n";
  infer::save_model(model, args.output);
  std::cout << "wrote " << args.output << "\n";
  return 0;
}

}  // namespace

Command add_sketch_command(CLI::App& app) {
  auto* sub = app.add_subcommand("sketch", "replace a TorchScript model's Linear and Conv2d layers by sketched "
                                           "low-rank ones initialised from their weights");
  auto args = std::make_shared<SketchArgs>();
  sub->add_option("input", args->input, "TorchScript model (torch.jit.save or afterburner train --export)")
      ->required();
  sub->add_option("-o,--output", args->output, "where to write the sketched model")->required();
  sub->add_option("--terms", args->terms, "sketched terms per layer (L)")->capture_default_str();
  auto* rank = sub->add_option("--rank", args->rank, "rank of each term (k), the same for every layer");
  auto* budget = sub->add_option("--budget", args->budget,
                                 "instead of --rank: the largest rank whose weights stay within this fraction "
                                 "of each layer's, in (0, 1)");
  rank->excludes(budget);
  return {sub, [args] { return run_sketch(*args); }};
}

}  // namespace afterburner::tools
