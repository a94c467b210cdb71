#include "afterburner/core/threads.h"

#include "afterburner/core/blas.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <thread>

namespace afterburner {

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadsGuard::ThreadsGuard(int n) : previous_(at::get_num_threads()), previous_blas_(blas_threads()) {
  if (n <= 0) return;
  at::set_num_threads(n);
  set_blas_threads(n);
}

ThreadsGuard::~ThreadsGuard() {
  at::set_num_threads(previous_);
  if (previous_blas_ > 0) set_blas_threads(previous_blas_);
}

BlasThreadsGuard::BlasThreadsGuard() : previous_(at::get_num_threads()), previous_blas_(blas_threads()) {
  at::set_num_threads(1);
  if (previous_blas_ > 0) set_blas_threads(previous_);
}

BlasThreadsGuard::~BlasThreadsGuard() {
  at::set_num_threads(previous_);
  if (previous_blas_ > 0) set_blas_threads(previous_blas_);
}

}  // namespace afterburner
