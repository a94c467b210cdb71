// RAII for LibTorch's intra-op thread count, and OpenBLAS's with it or beside it.
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

// For work made of BLAS calls with small LibTorch ops between them (the randomized
// factorizations): LibTorch's pool at one thread, since its idle OpenMP threads spin on the cores
// OpenBLAS's own threads then need (a randomized SVD ran 3.7x slower, measured), and OpenBLAS at
// LibTorch's previous count. Both restored at the end of the scope.
class BlasThreadsGuard {
 public:
  BlasThreadsGuard();
  ~BlasThreadsGuard();
  BlasThreadsGuard(const BlasThreadsGuard&) = delete;
  BlasThreadsGuard& operator=(const BlasThreadsGuard&) = delete;

 private:
  int previous_;
  int previous_blas_;
};

}  // namespace afterburner
