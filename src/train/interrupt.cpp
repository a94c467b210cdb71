#include "afterburner/train/interrupt.h"

#include <time.h>

#include "afterburner/core/signals.h"

namespace afterburner::train {
namespace {

std::atomic<bool> requested{false};
std::atomic<int64_t> first_at_ns{0};

int64_t now_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

extern "C" void on_interrupt(int signal) {
  constexpr int64_t kSamePress = 1'000'000'000;
  if (!requested.exchange(true)) {
    first_at_ns = now_ns();
  } else if (now_ns() - first_at_ns > kSamePress) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
}

}  // namespace

const std::atomic<bool>& interrupt_requested() { return requested; }

StopOnInterrupt::StopOnInterrupt() {
  requested = false;
  previous_ = handle_signal(SIGINT, on_interrupt);
}

StopOnInterrupt::~StopOnInterrupt() {
  sigaction(SIGINT, &previous_, nullptr);
  requested = false;  // a later run without a guard is not stopped by this one's Ctrl-C
}

}  // namespace afterburner::train
