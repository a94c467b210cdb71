// Where the time of a training step goes: waiting for data, forward, backward, optimizer.
//
//   profile::StepTimer timer;
//   timer.start(profile::Phase::data);
//   for (auto& batch : loader) {          // the wait inside the loader's ++ falls in `data`
//     timer.start(profile::Phase::forward);
//     auto loss = model(batch.data);
//     timer.start(profile::Phase::backward);
//     loss.backward();
//     {
//       auto scope = timer.scope(profile::Phase::optimizer);
//       optimizer.step();
//     }
//     timer.end_step(batch.data.size(0));
//     timer.start(profile::Phase::data);
//   }
//   nlohmann::json report = timer.stats();  // see to_json below
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace afterburner::profile {

// data is the time spent waiting for the loader to hand over a batch.
enum class Phase { data, forward, backward, optimizer };
inline constexpr size_t kPhaseCount = 4;

// "data", "forward", "backward", "optimizer".
const char* phase_name(Phase phase);

struct PhaseStats {
  double total_s = 0;    // over all recorded steps
  double mean_ms = 0;    // per step
  double median_ms = 0;  // per step
};

struct StepStats {
  int64_t steps = 0;
  int64_t samples = 0;
  double total_s = 0;          // sum of all phases over all steps
  double samples_per_sec = 0;  // samples / total_s, 0 before any timed step
  std::array<PhaseStats, kPhaseCount> phases{};

  const PhaseStats& operator[](Phase phase) const { return phases[static_cast<size_t>(phase)]; }
};

// {"steps", "samples", "total_s", "samples_per_sec",
//  "phases": {"data": {"total_s", "mean_ms", "median_ms"}, "forward": {...}, ...}}
void to_json(nlohmann::json& out, const StepStats& stats);

class StepTimer;

// Closes its phase on destruction (time until the next start() is not counted). Scopes do
// not nest: starting another phase inside one ends the outer phase.
class PhaseScope {
 public:
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
  ~PhaseScope();

 private:
  friend class StepTimer;
  explicit PhaseScope(StepTimer& timer) : timer_(timer) {}
  StepTimer& timer_;
};

// Times phases on steady_clock. One phase runs at a time; a phase may run several times in a
// step and its durations add up. Not thread-safe: drive it from the training loop's thread.
class StepTimer {
 public:
  using PhaseSeconds = std::array<double, kPhaseCount>;  // indexed by Phase

  // Ends the running phase (if any) and starts `phase`.
  void start(Phase phase);
  // Ends the running phase (if any) without starting another.
  void stop();
  // Ends the running phase and records one step that processed `samples` samples.
  void end_step(int64_t samples);
  [[nodiscard]] PhaseScope scope(Phase phase);

  StepStats stats() const;
  // The phases of the step end_step() recorded last (zeros before any), and the seconds of all
  // recorded steps: in constant time, for a report after every step.
  const PhaseSeconds& last_step() const;
  double recorded_seconds() const { return recorded_seconds_; }
  // Forgets all steps and the running phase.
  void reset();

 private:
  using Clock = std::chrono::steady_clock;

  std::optional<Phase> running_;
  Clock::time_point running_since_;
  PhaseSeconds current_step_{};
  std::vector<PhaseSeconds> steps_;
  int64_t samples_ = 0;
  double recorded_seconds_ = 0;
};

}  // namespace afterburner::profile
