#include "afterburner/core/threads.h"

#include <ATen/Parallel.h>

namespace afterburner {

ThreadsGuard::ThreadsGuard(int n) : previous_(at::get_num_threads()) {
  if (n > 0) at::set_num_threads(n);
}

ThreadsGuard::~ThreadsGuard() { at::set_num_threads(previous_); }

}  // namespace afterburner
