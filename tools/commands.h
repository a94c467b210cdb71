// Each subcommand registers itself on the top-level app and hands back the action to run
// once the command line has parsed. Actions return the process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace afterburner::tools {

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_train_command(CLI::App& app);
Command add_profile_command(CLI::App& app);
Command add_optimize_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_loadgen_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_sketch_command(CLI::App& app);
Command add_tune_command(CLI::App& app);
Command add_data_command(CLI::App& app);

}  // namespace afterburner::tools
