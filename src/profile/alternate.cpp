#include "afterburner/profile/alternate.h"

#include <algorithm>
#include <chrono>

namespace afterburner::profile {

Milliseconds spread_of(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return {(samples[(n - 1) / 2] + samples[n / 2]) / 2, samples.front(), samples.back()};
}

double milliseconds(const std::function<void()>& step) {
  const auto start = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::pair<Milliseconds, Milliseconds> time_alternately(const std::function<void()>& first,
                                                       const std::function<void()>& second, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) {
    first();
    second();
  }
  std::vector<double> first_times, second_times;
  for (int rep = 0; rep < reps; ++rep) {
    first_times.push_back(milliseconds(first));
    second_times.push_back(milliseconds(second));
  }
  return {spread_of(first_times), spread_of(second_times)};
}

}  // namespace afterburner::profile
