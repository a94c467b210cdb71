#include "afterburner/core/cpu.h"

#include <fstream>
#include <string>

namespace afterburner {
namespace {

bool read_native_bf16() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    return line.find(" avx512_bf16") != std::string::npos || line.find(" amx_bf16") != std::string::npos;
  }
  return false;
}

}  // namespace

bool cpu_has_native_bf16() {
  static const bool native = read_native_bf16();
  return native;
}

}  // namespace afterburner
