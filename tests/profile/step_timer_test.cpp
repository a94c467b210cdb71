#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

#include "afterburner/profile/step_timer.h"

namespace afterburner::profile {
namespace {

using std::chrono::milliseconds;

void sleep_ms(int ms) { std::this_thread::sleep_for(milliseconds(ms)); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// sleep_for sleeps at least as long as asked, so each sleep is a lower bound of its phase.
TEST(StepTimer, PhaseTotalsAddUpAndTheLongestSleepDominates) {
  StepTimer timer;
  for (int step = 0; step < 3; ++step) {
    timer.start(Phase::data);
    sleep_ms(2);
    timer.start(Phase::forward);
    sleep_ms(25);
    timer.start(Phase::backward);
    sleep_ms(6);
    timer.start(Phase::optimizer);
    sleep_ms(1);
    timer.end_step(32);
  }
  StepStats stats = timer.stats();
  EXPECT_EQ(stats.steps, 3);
  EXPECT_EQ(stats.samples, 96);
  double sum = 0;
  for (const PhaseStats& phase : stats.phases) sum += phase.total_s;
  EXPECT_DOUBLE_EQ(stats.total_s, sum);
  EXPECT_DOUBLE_EQ(stats.samples_per_sec, 96 / stats.total_s);
  EXPECT_GE(stats[Phase::data].total_s, 3 * 0.002);
  EXPECT_GE(stats[Phase::forward].total_s, 3 * 0.025);
  EXPECT_GE(stats[Phase::backward].total_s, 3 * 0.006);
  EXPECT_GE(stats[Phase::optimizer].total_s, 3 * 0.001);
  for (Phase other : {Phase::data, Phase::backward, Phase::optimizer}) {
    EXPECT_GT(stats[Phase::forward].total_s, stats[other].total_s) << phase_name(other);
  }
  for (const PhaseStats& phase : stats.phases) {
    EXPECT_DOUBLE_EQ(phase.mean_ms, phase.total_s * 1e3 / 3);
  }
}

TEST(StepTimer, APhaseRunningTwiceInAStepAddsUp) {
  StepTimer timer;
  timer.start(Phase::data);
  sleep_ms(3);
  timer.start(Phase::forward);
  sleep_ms(1);
  timer.start(Phase::data);
  sleep_ms(3);
  timer.end_step(8);
  StepStats stats = timer.stats();
  EXPECT_GE(stats[Phase::data].total_s, 0.006);
  // One step: its duration is the mean and the median.
  EXPECT_DOUBLE_EQ(stats[Phase::data].median_ms, stats[Phase::data].mean_ms);
  EXPECT_DOUBLE_EQ(stats[Phase::data].mean_ms, stats[Phase::data].total_s * 1e3);
}

TEST(StepTimer, MedianOfTwoStepsIsTheirMean) {
  StepTimer timer;
  for (int ms : {2, 12}) {
    timer.start(Phase::forward);
    sleep_ms(ms);
    timer.end_step(1);
  }
  StepStats stats = timer.stats();
  EXPECT_DOUBLE_EQ(stats[Phase::forward].median_ms, stats[Phase::forward].mean_ms);
}

TEST(StepTimer, MedianIgnoresAnOutlierStep) {
  StepTimer timer;
  for (int ms : {1, 1, 80, 1, 1}) {
    timer.start(Phase::backward);
    sleep_ms(ms);
    timer.end_step(1);
  }
  PhaseStats backward = timer.stats()[Phase::backward];
  EXPECT_GE(backward.median_ms, 1.0);
  EXPECT_GE(backward.mean_ms, 80.0 / 5);
  EXPECT_LT(backward.median_ms, backward.mean_ms);
}

// The gap outside any phase lasts at least gap_s, so the timed total can be at most the
// wall time minus the gap.
TEST(StepTimer, TimeOutsidePhasesIsNotCounted) {
  const double gap_s = 0.020;
  StepTimer timer;
  auto wall_start = std::chrono::steady_clock::now();
  {
    auto scope = timer.scope(Phase::optimizer);
    sleep_ms(2);
  }
  sleep_ms(20);
  timer.start(Phase::forward);
  sleep_ms(2);
  timer.stop();
  sleep_ms(20);
  timer.end_step(4);
  double wall_s = seconds_since(wall_start);
  StepStats stats = timer.stats();
  EXPECT_GE(stats[Phase::optimizer].total_s, 0.002);
  EXPECT_GE(stats[Phase::forward].total_s, 0.002);
  EXPECT_LE(stats.total_s, wall_s - 2 * gap_s);
}

TEST(StepTimer, StatsBeforeAnyStepAreZero) {
  StepTimer timer;
  timer.start(Phase::data);
  StepStats stats = timer.stats();
  EXPECT_EQ(stats.steps, 0);
  EXPECT_EQ(stats.total_s, 0);
  EXPECT_EQ(stats.samples_per_sec, 0);
  for (const PhaseStats& phase : stats.phases) {
    EXPECT_EQ(phase.total_s, 0);
    EXPECT_EQ(phase.median_ms, 0);
  }
}

TEST(StepTimer, ResetForgetsStepsAndTheRunningPhase) {
  StepTimer timer;
  timer.start(Phase::forward);
  sleep_ms(1);
  timer.end_step(10);
  timer.start(Phase::backward);
  sleep_ms(1);
  timer.reset();
  timer.end_step(3);
  StepStats stats = timer.stats();
  EXPECT_EQ(stats.steps, 1);
  EXPECT_EQ(stats.samples, 3);
  EXPECT_EQ(stats.total_s, 0);
}

TEST(StepTimer, JsonCarriesEveryPhaseByName) {
  StepTimer timer;
  timer.start(Phase::data);
  sleep_ms(1);
  timer.start(Phase::optimizer);
  sleep_ms(1);
  timer.end_step(16);
  StepStats stats = timer.stats();
  nlohmann::json parsed = nlohmann::json::parse(nlohmann::json(stats).dump());
  EXPECT_EQ(parsed.at("steps").get<int64_t>(), 1);
  EXPECT_EQ(parsed.at("samples").get<int64_t>(), 16);
  EXPECT_DOUBLE_EQ(parsed.at("samples_per_sec").get<double>(), stats.samples_per_sec);
  EXPECT_DOUBLE_EQ(parsed.at("total_s").get<double>(), stats.total_s);
  for (Phase phase : {Phase::data, Phase::forward, Phase::backward, Phase::optimizer}) {
    const nlohmann::json& entry = parsed.at("phases").at(phase_name(phase));
    EXPECT_DOUBLE_EQ(entry.at("total_s").get<double>(), stats[phase].total_s);
    EXPECT_DOUBLE_EQ(entry.at("mean_ms").get<double>(), stats[phase].mean_ms);
    EXPECT_DOUBLE_EQ(entry.at("median_ms").get<double>(), stats[phase].median_ms);
  }
}

}  // namespace
}  // namespace afterburner::profile
