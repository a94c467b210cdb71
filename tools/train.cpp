// afterburner train: train a model and print the final report; Ctrl-C stops after the step in
// progress, keeps the run (checkpoint, model, report) and exits 130.
#include <iostream>
#include <memory>

#include "afterburner/dist/training.h"
#include "afterburner/train/interrupt.h"
#include "afterburner/train/run.h"
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
            const train::TrainConfig config = options->resolve();
            if (*print_config) {
              std::cout << train::to_toml(config);
              return 0;
            }
            train::StopOnInterrupt stop_on_ctrl_c;
            const auto report = dist::run_training(config);
            if (!report) return 0;
            std::cout << report->summary();
            if (report->stop_reason != "interrupted") return 0;
            std::cerr << "afterburner: interrupted after step " << report->steps << "; " << train::kept(config, *report)
                      << "\n";
            return 130;
          }};
}

}  // namespace afterburner::tools
