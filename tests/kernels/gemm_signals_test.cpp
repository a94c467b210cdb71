// Signals landing in oneDNN's f32 GEMM: its kernels point rsp into the heap, and a handler
// installed with handle_signal runs on the alternate signal stack instead (core/signals.h), so
// the heap stays intact.
#include <gtest/gtest.h>
#include <pthread.h>
#include <ucontext.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "afterburner/core/signals.h"
#include "afterburner/kernels/gemm.h"

namespace afterburner::kernels {
namespace {

std::atomic<int> handled{0};
std::atomic<int> handled_off_the_alternate_stack{0};

extern "C" void count_where_it_runs(int) {
  stack_t current{};
  sigaltstack(nullptr, &current);
  ++handled;
  if (!(current.ss_flags & SS_ONSTACK)) ++handled_off_the_alternate_stack;
}

// The thread's own stack, [low, high).
std::pair<uintptr_t, uintptr_t> thread_stack() {
  pthread_attr_t attributes;
  pthread_getattr_np(pthread_self(), &attributes);
  void* low = nullptr;
  size_t size = 0;
  pthread_attr_getstack(&attributes, &low, &size);
  pthread_attr_destroy(&attributes);
  return {reinterpret_cast<uintptr_t>(low), reinterpret_cast<uintptr_t>(low) + size};
}

std::pair<uintptr_t, uintptr_t> computing_stack;
std::atomic<int> interrupted_off_its_stack{0};

// Where the interrupted code had rsp: outside the thread's stack is the hazard handle_signal
// guards against (a plain handler would have pushed its frame there).
extern "C" void note_interrupted_stack(int, siginfo_t*, void* context) {
  const auto rsp = static_cast<uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RSP]);
  stack_t alternate{};
  sigaltstack(nullptr, &alternate);
  const auto alternate_low = reinterpret_cast<uintptr_t>(alternate.ss_sp);
  const bool in_a_handler = rsp >= alternate_low && rsp < alternate_low + alternate.ss_size;
  const bool on_its_stack = rsp >= computing_stack.first && rsp < computing_stack.second;
  if (!on_its_stack && !in_a_handler) ++interrupted_off_its_stack;
}

// Signals this thread every `period` until destroyed.
class Signaller {
 public:
  Signaller(int signal, std::chrono::microseconds period)
      : target_(pthread_self()), thread_([this, signal, period] {
          while (!done_) {
            pthread_kill(target_, signal);
            std::this_thread::sleep_for(period);
          }
        }) {}
  ~Signaller() {
    done_ = true;
    thread_.join();
  }

 private:
  const pthread_t target_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(GemmUnderSignals, HandlersRunOnTheAlternateStackAndTheHeapStaysIntact) {
  handled = handled_off_the_alternate_stack = interrupted_off_its_stack = 0;
  computing_stack = thread_stack();
  const struct sigaction previous_usr1 = handle_signal(SIGUSR1, count_where_it_runs);
  struct sigaction observer {}, previous_usr2 {};
  observer.sa_sigaction = note_interrupted_stack;
  observer.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&observer.sa_mask);
  sigaction(SIGUSR2, &observer, &previous_usr2);

  const torch::Tensor a = torch::randn({192, 768}), b = torch::randn({768, 320});
  const torch::Tensor expected = torch::mm(a.to(torch::kDouble), b.to(torch::kDouble));
  std::vector<torch::Tensor> products;
  {
    Signaller usr1(SIGUSR1, std::chrono::microseconds(150));
    Signaller usr2(SIGUSR2, std::chrono::microseconds(350));
    for (int i = 0; i < 200; ++i) products.push_back(kernels::mm(a, b));  // dnnl_sgemm
  }
  sigaction(SIGUSR1, &previous_usr1, nullptr);
  sigaction(SIGUSR2, &previous_usr2, nullptr);

  RecordProperty("signals_handled", handled.load());
  RecordProperty("signals_that_found_rsp_off_the_stack", interrupted_off_its_stack.load());
  EXPECT_GT(handled.load(), 0);
  EXPECT_EQ(handled_off_the_alternate_stack.load(), 0);
  // Nothing in the heap was overwritten: every product, each its own allocation, is intact.
  for (const auto& product : products) {
    ASSERT_TRUE(torch::allclose(product.to(torch::kDouble), expected, 1e-5, 1e-3));
  }
}

}  // namespace
}  // namespace afterburner::kernels
