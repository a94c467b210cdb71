// Profiles a window of training steps with the LibTorch profiler, prints the op table and
// writes a Chrome trace, then stops the run.
//
//   trainer.add_callback(std::make_shared<ProfileSteps>(/*warmup=*/5, /*steps=*/20, "trace.json"));
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "afterburner/profile/profiler.h"
#include "afterburner/train/callbacks.h"

namespace afterburner::train {

class ProfileSteps : public Callback {
 public:
  // Starts after `warmup` steps (so one-time set-up costs stay out), profiles `steps` steps.
  ProfileSteps(int64_t warmup, int64_t steps, std::string trace_path = "");
  void on_step_end(const StepInfo& info) override;
  std::string stop_reason() const override;
  // The result once the window has ended.
  const std::optional<profile::ProfileResult>& result() const { return result_; }

 private:
  int64_t warmup_;
  int64_t steps_;
  std::string trace_path_;
  std::unique_ptr<profile::Profiler> profiler_;
  std::optional<profile::ProfileResult> result_;
};

}  // namespace afterburner::train
