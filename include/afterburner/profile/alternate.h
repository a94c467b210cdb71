// Timing two steps side by side: repetitions alternate between them, so load from elsewhere
// on the machine lands on both rather than on whichever happened to run during it, and each is
// reported as median, min and max.
//
//   namespace profile = afterburner::profile;
//   auto [ours, theirs] = profile::time_alternately([&] { fused(x); }, [&] { reference(x); }, 20);
//   fmt::print("{:.3f} ms vs {:.3f} ms: {:.2f}x\n", ours.median, theirs.median, theirs.median / ours.median);
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace afterburner::profile {

struct Milliseconds {
  double median = 0, min = 0, max = 0;
};

// The median (mean of the middle two for an even count), min and max of `samples` (not empty).
Milliseconds spread_of(std::vector<double> samples);

// Wall time of one call of `step`.
double milliseconds(const std::function<void()>& step);

// `warmup` untimed calls of each first (page faults, lazy initialisation), then `reps` timed
// calls of each, alternating.
std::pair<Milliseconds, Milliseconds> time_alternately(const std::function<void()>& first,
                                                       const std::function<void()>& second, int reps, int warmup = 3);

}  // namespace afterburner::profile
