// afterburner profile: a few training steps under the LibTorch profiler.
#include <iostream>
#include <memory>

#include "afterburner/train/run.h"
#include "commands.h"
#include "config_options.h"

namespace afterburner::tools {

Command add_profile_command(CLI::App& app) {
  auto* sub = app.add_subcommand("profile", "profile training steps: op table by self time and a Chrome trace");
  train::TrainConfig defaults;
  defaults.profile_steps = 20;
  defaults.epochs = 1;
  defaults.progress = "none";
  defaults.trace = "afterburner-trace.json";
  auto options = std::make_shared<ConfigOptions>(sub, defaults);
  return {sub, [options] {
            train::run_training(options->resolve());
            return 0;
          }};
}

}  // namespace afterburner::tools
