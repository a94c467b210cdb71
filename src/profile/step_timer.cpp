#include "afterburner/profile/step_timer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace afterburner::profile {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::data: return "data";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
  }
  return "unknown";
}

void to_json(nlohmann::json& out, const StepStats& stats) {
  nlohmann::json phases = nlohmann::json::object();
  for (size_t i = 0; i < kPhaseCount; ++i) {
    const PhaseStats& phase = stats.phases[i];
    phases[phase_name(static_cast<Phase>(i))] = {
        {"total_s", phase.total_s}, {"mean_ms", phase.mean_ms}, {"median_ms", phase.median_ms}};
  }
  out = {{"steps", stats.steps},
         {"samples", stats.samples},
         {"total_s", stats.total_s},
         {"samples_per_sec", stats.samples_per_sec},
         {"phases", std::move(phases)}};
}

PhaseScope::~PhaseScope() { timer_.stop(); }

void StepTimer::start(Phase phase) {
  stop();
  running_ = phase;
  running_since_ = Clock::now();
}

void StepTimer::stop() {
  if (!running_) return;
  std::chrono::duration<double> elapsed = Clock::now() - running_since_;
  current_step_[static_cast<size_t>(*running_)] += elapsed.count();
  running_.reset();
}

void StepTimer::end_step(int64_t samples) {
  stop();
  steps_.push_back(current_step_);
  for (double seconds : current_step_) recorded_seconds_ += seconds;
  current_step_ = {};
  samples_ += samples;
}

const StepTimer::PhaseSeconds& StepTimer::last_step() const {
  static const PhaseSeconds kNone{};
  return steps_.empty() ? kNone : steps_.back();
}

PhaseScope StepTimer::scope(Phase phase) {
  start(phase);
  return PhaseScope(*this);
}

// The middle element for an odd count, the mean of the two middle ones for an even count.
static double median(std::vector<double> values) {
  size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  double lower = *std::max_element(values.begin(), values.begin() + middle);
  return (lower + upper) / 2;
}

StepStats StepTimer::stats() const {
  StepStats stats;
  stats.steps = static_cast<int64_t>(steps_.size());
  stats.samples = samples_;
  if (steps_.empty()) return stats;
  std::vector<double> per_step(steps_.size());
  for (size_t phase = 0; phase < kPhaseCount; ++phase) {
    for (size_t step = 0; step < steps_.size(); ++step) per_step[step] = steps_[step][phase];
    PhaseStats& out = stats.phases[phase];
    for (double seconds : per_step) out.total_s += seconds;
    out.mean_ms = out.total_s * 1e3 / static_cast<double>(steps_.size());
    out.median_ms = median(per_step) * 1e3;
    stats.total_s += out.total_s;
  }
  if (stats.total_s > 0) stats.samples_per_sec = static_cast<double>(samples_) / stats.total_s;
  return stats;
}

void StepTimer::reset() { *this = StepTimer(); }

}  // namespace afterburner::profile
