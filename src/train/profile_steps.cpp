#include "afterburner/train/profile_steps.h"

#include <fmt/format.h>

namespace afterburner::train {

ProfileSteps::ProfileSteps(int64_t warmup, int64_t steps, std::string trace_path)
    : warmup_(warmup), steps_(steps), trace_path_(std::move(trace_path)) {}

void ProfileSteps::on_step_end(const StepInfo& info) {
  if (result_) return;
  if (!profiler_ && info.step >= warmup_) {
    profiler_ = std::make_unique<profile::Profiler>();
    return;
  }
  if (profiler_ && info.step >= warmup_ + steps_) {
    result_ = profiler_->stop();
    profiler_.reset();
    fmt::print("\nops of {} training steps by self time:\n{}", steps_, result_->table(25));
    if (!trace_path_.empty()) {
      result_->write_chrome_trace(trace_path_);
      fmt::print("Chrome trace written to {} (open it in Perfetto)\n", trace_path_);
    }
  }
}

std::string ProfileSteps::stop_reason() const { return result_ ? "profiled" : ""; }

}  // namespace afterburner::train
