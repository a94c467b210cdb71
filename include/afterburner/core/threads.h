// RAII for LibTorch's intra-op thread count.
//
//   {
//     afterburner::ThreadsGuard threads(1);  // deterministic single-thread section
//     ...
//   }                                        // previous count restored
#pragma once

namespace afterburner {

class ThreadsGuard {
 public:
  // n <= 0 leaves the count as it is.
  explicit ThreadsGuard(int n);
  ~ThreadsGuard();
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int previous_;
};

}  // namespace afterburner
