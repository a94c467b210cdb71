#include "afterburner/core/signals.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "afterburner/core/error.h"

namespace afterburner {
namespace {

// Room for the kernel's signal frame with the AVX-512 (or AMX) register state, and for the
// handler's own calls, with margin.
size_t alternate_stack_bytes() {
  const long minimum = sysconf(_SC_MINSIGSTKSZ);
  return std::max<size_t>(64 * 1024, minimum > 0 ? 4 * static_cast<size_t>(minimum) : 0);
}

// The calling thread's alternate signal stack; disabled and unmapped when the thread ends.
class AlternateStack {
 public:
  AlternateStack() {
    stack_t current{};
    if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) return;  // keeps its own
    bytes_ = alternate_stack_bytes();
    void* memory = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (memory == MAP_FAILED) throw Error(std::string("alternate signal stack: mmap failed: ") + std::strerror(errno));
    stack_t stack{};
    stack.ss_sp = memory;
    stack.ss_size = bytes_;
    if (sigaltstack(&stack, nullptr) != 0) {
      const int error = errno;
      munmap(memory, bytes_);
      throw Error(std::string("alternate signal stack: sigaltstack failed: ") + std::strerror(error));
    }
    memory_ = memory;
  }
  ~AlternateStack() {
    if (memory_ == nullptr) return;
    stack_t disable{};
    disable.ss_flags = SS_DISABLE;
    sigaltstack(&disable, nullptr);
    munmap(memory_, bytes_);
  }
  AlternateStack(const AlternateStack&) = delete;
  AlternateStack& operator=(const AlternateStack&) = delete;

 private:
  void* memory_ = nullptr;
  size_t bytes_ = 0;
};

// The thread that loads the library: the CLI's main thread, Python's importing thread. Where this
// fails, handle_signal says so when a handler is installed.
[[maybe_unused]] const bool loading_thread_has_alternate_stack = [] {
  try {
    ensure_alternate_signal_stack();
    return true;
  } catch (const Error&) {
    return false;
  }
}();

}  // namespace

void ensure_alternate_signal_stack() { thread_local AlternateStack stack; }

struct sigaction handle_signal(int signal, void (*handler)(int), int flags) {
  ensure_alternate_signal_stack();
  struct sigaction action {}, previous {};
  action.sa_handler = handler;
  action.sa_flags = flags | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(signal, &action, &previous) != 0) {
    throw Error("signal " + std::to_string(signal) + " (" + strsignal(signal) + "): sigaction failed: " +
                std::strerror(errno));
  }
  return previous;
}

}  // namespace afterburner
