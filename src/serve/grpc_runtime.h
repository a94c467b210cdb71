// Internal to the serve area: process-wide settings every gRPC user here (the server, loadgen's
// client) applies before its first call.
#pragma once

#include <absl/synchronization/mutex.h>

#include <mutex>

namespace afterburner::serve::detail {

// Debian builds abseil without NDEBUG, so every absl::Mutex gRPC locks records the lock order
// for deadlock detection (absl's GraphCycles took about 1.4% of the server's CPU at 10,000 calls/s,
// measured with perf): off, as in abseil's release builds. gRPC's own invariants do not depend on it.
inline void use_release_mode_abseil() {
  static std::once_flag once;
  std::call_once(once, [] { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); });
}

}  // namespace afterburner::serve::detail
