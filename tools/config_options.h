// Registers every TrainConfig field as a flag (--batch-size, --augment/--no-augment, ...) plus
// --config FILE, and resolves them as defaults < TOML file < flags.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "afterburner/train/config.h"

namespace afterburner::tools {

class ConfigOptions {
 public:
  // Fields named in `excluded` get no flag (a subcommand that gives the flag another meaning).
  explicit ConfigOptions(CLI::App* command, const train::TrainConfig& defaults = {},
                         const std::set<std::string>& excluded = {});
  // The config after parsing: defaults, then the TOML file, then the flags given.
  train::TrainConfig resolve() const;
  // The first of its flags the command line gave ("--epochs", "--config"), or "" when none: for a
  // command whose other mode takes no training options.
  std::string first_given() const;

 private:
  train::TrainConfig defaults_;
  std::string config_file_;
  std::shared_ptr<std::map<std::string, std::string>> given_;
  std::shared_ptr<std::map<std::string, std::string>> flag_storage_;  // CLI11 writes flag text here
};

}  // namespace afterburner::tools
