// Ctrl-C (SIGINT) as a request to stop: a Trainer ends its run after the step in progress (it
// writes its checkpoint and report as at any other stop, with stop_reason "interrupted"), tune
// after the measurement in progress. A second Ctrl-C, a second or more after the first, ends
// the process at once; one sooner is the same keypress reaching the process twice (a terminal
// signals the whole process group, and `--nproc`'s launcher forwards it to its ranks again).
//
//   afterburner::train::StopOnInterrupt stop_on_ctrl_c;   // while the run lasts
//   auto report = afterburner::train::run_training(config);
//   if (report.stop_reason == "interrupted") return 130;
#pragma once

#include <atomic>
#include <csignal>

namespace afterburner::train {

// Set by SIGINT while a StopOnInterrupt lives; Trainer and tune read it.
const std::atomic<bool>& interrupt_requested();

// Installs the SIGINT handler for its lifetime and restores the previous one after; the request
// lasts as long as the guard.
class StopOnInterrupt {
 public:
  StopOnInterrupt();
  ~StopOnInterrupt();
  StopOnInterrupt(const StopOnInterrupt&) = delete;
  StopOnInterrupt& operator=(const StopOnInterrupt&) = delete;

 private:
  struct sigaction previous_ {};
};

}  // namespace afterburner::train
