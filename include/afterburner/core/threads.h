// RAII for LibTorch's intra-op thread count, and OpenBLAS's with it.
//
//   {
//     afterburner::ThreadsGuard threads(1);  // deterministic single-thread section
//     afterburner::ThreadsGuard all(afterburner::available_cores());
//     ...
//   }                                        // previous count restored
#pragma once

namespace afterburner {

// Cores this process may run on (its CPU affinity), at least 1. LibTorch's own default can be
// lower (it may start with one thread), so "use the machine" means asking for this many.
int available_cores();

class ThreadsGuard {
 public:
  // n <= 0 leaves the count as it is.
  explicit ThreadsGuard(int n);
  ~ThreadsGuard();
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int previous_;
  int previous_blas_;
};

}  // namespace afterburner
