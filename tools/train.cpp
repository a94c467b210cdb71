#include "commands.h"

namespace afterburner::tools {

Command add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "train a model (default: cnn on Fashion-MNIST)");
  return {sub, [] { return 0; }};
}

}  // namespace afterburner::tools
