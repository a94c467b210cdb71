// The version of afterburner, as the CMake project declares it.
//
//   std::cout << "afterburner " << afterburner::version() << "\n";   // "afterburner 0.1.0"
#pragma once

namespace afterburner {

const char* version();

}  // namespace afterburner
