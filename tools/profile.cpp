#include "commands.h"

namespace afterburner::tools {

Command add_profile_command(CLI::App& app) {
  auto* sub = app.add_subcommand("profile", "run training steps under the LibTorch profiler");
  return {sub, [] { return 0; }};
}

}  // namespace afterburner::tools
