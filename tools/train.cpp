// afterburner train: train a zoo model and print the final report.
#include <iostream>
#include <memory>

#include "afterburner/dist/training.h"
#include "commands.h"
#include "config_options.h"

namespace afterburner::tools {

Command add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "train a model (default: cnn on Fashion-MNIST) and report accuracy, "
                                          "speed and memory; --nproc N trains data-parallel on N ranks");
  auto options = std::make_shared<ConfigOptions>(sub);
  auto print_config = std::make_shared<bool>(false);
  sub->add_flag("--print-config", *print_config, "print the resolved options as TOML for --config, and exit");
  return {sub, [options, print_config] {
            if (*print_config) {
              std::cout << train::to_toml(options->resolve());
              return 0;
            }
            if (auto report = dist::run_training(options->resolve())) std::cout << report->summary();
            return 0;
          }};
}

}  // namespace afterburner::tools
