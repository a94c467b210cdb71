// afterburner: make PyTorch models train and serve fast on the machine you have.
#include <iostream>
#include <vector>

#include "afterburner/core/blas.h"
#include "afterburner/core/error.h"
#include "afterburner/core/version.h"
#include "commands.h"

int main(int argc, char** argv) {
  using namespace afterburner;
  CLI::App app{"afterburner: make PyTorch models train and serve fast on this machine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("afterburner ") + version());
  std::vector<tools::Command> commands{tools::add_train_command(app),
                                       tools::add_profile_command(app),
                                       tools::add_optimize_command(app),
                                       tools::add_serve_command(app),
                                       tools::add_loadgen_command(app),
                                       tools::add_bench_command(app),
                                       tools::add_sketch_command(app),
                                       tools::add_tune_command(app),
                                       tools::add_data_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "afterburner: " << e.what() << " (see --help)\n";
    return 2;
  }
  BlasInfo blas = detect_blas();
  if (blas.is_reference) std::cerr << "afterburner: " << blas_warning(blas) << "\n";
  try {
    for (auto& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const Error& e) {
    std::cerr << "afterburner: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {  // LibTorch's, without its C++ backtrace
    std::cerr << "afterburner: " << first_line(e) << "\n";
    return 1;
  }
  return 2;
}
