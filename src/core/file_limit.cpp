#include "afterburner/core/file_limit.h"

#include <sys/resource.h>

#include <algorithm>

namespace afterburner {

std::uint64_t raise_open_file_limit(std::uint64_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return limit.rlim_cur;
  rlimit raised = limit;
  raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min<rlim_t>(wanted, limit.rlim_max);
  if (raised.rlim_cur > limit.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
  return limit.rlim_cur;
}

}  // namespace afterburner
