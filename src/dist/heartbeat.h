// Which ranks stopped answering, for the one line a failed rank prints: Gloo's errors name at
// most an address. Every rank bumps its own counter in the job's store once a second, from a
// thread of its own; when a collective fails, the counters that no longer move name the ranks
// that died or stalled.
//
//   Heartbeat heartbeat(group);
//   try { train(); } catch (const std::exception& e) { auto silent = heartbeat.silent_ranks(); ... }
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "afterburner/dist/group.h"

namespace afterburner::dist {

class Heartbeat {
 public:
  // `rank0_serves_store`: rank 0 serves the store (not torchrun's agent), so a store that is
  // gone means rank 0 is.
  Heartbeat(const Group& group, bool rank0_serves_store);
  ~Heartbeat();  // never waits for a store that does not answer
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // "rank 1 stopped answering", "ranks 1, 3 stopped answering", or that the rendezvous store (and
  // rank 0 when it serves it) stopped answering; empty when every rank beats. Takes 2.5 s.
  std::string silent_ranks() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace afterburner::dist
