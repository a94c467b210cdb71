#include "afterburner/core/version.h"

namespace afterburner {

// AFTERBURNER_VERSION is defined for this file alone (CMakeLists.txt), so a new version
// recompiles one file.
const char* version() { return AFTERBURNER_VERSION; }

}  // namespace afterburner
