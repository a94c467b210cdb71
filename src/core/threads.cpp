#include "afterburner/core/threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <thread>

namespace afterburner {

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadsGuard::ThreadsGuard(int n) : previous_(at::get_num_threads()) {
  if (n > 0) at::set_num_threads(n);
}

ThreadsGuard::~ThreadsGuard() { at::set_num_threads(previous_); }

}  // namespace afterburner
