// afterburner train: train a zoo model and print the final report.
#include <iostream>
#include <memory>

#include "afterburner/train/run.h"
#include "commands.h"
#include "config_options.h"

namespace afterburner::tools {

Command add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "train a model (default: cnn on Fashion-MNIST) and report accuracy, "
                                          "speed and memory");
  auto options = std::make_shared<ConfigOptions>(sub);
  return {sub, [options] {
            auto report = train::run_training(options->resolve());
            std::cout << report.summary();
            return 0;
          }};
}

}  // namespace afterburner::tools
