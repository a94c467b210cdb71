// The open-file limit a server holding many connections needs: each connection is a file
// descriptor, and the soft limit (often 1,024) is below what the hard limit allows.
//
//   const auto limit = afterburner::raise_open_file_limit(max_connections + 64);
//   if (limit < max_connections + 64) std::cerr << "warning: ...\n";
#pragma once

#include <cstdint>

namespace afterburner {

// Raises the soft RLIMIT_NOFILE towards `wanted`, as far as the hard limit allows (never lowers
// it); returns the soft limit in force afterwards.
std::uint64_t raise_open_file_limit(std::uint64_t wanted);

}  // namespace afterburner
