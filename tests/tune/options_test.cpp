// TuneOptions that cannot mean a tune are usage errors naming the flag, before any data is read.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "afterburner/core/error.h"
#include "afterburner/tune/tune.h"

namespace afterburner::tune {
namespace {

::testing::AssertionResult refused(const TuneOptions& options, const std::string& message) {
  try {
    validate(options);
  } catch (const UsageError& e) {
    if (std::string(e.what()) == message) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "said: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST(TuneOptions, ABudgetThatIsNotAPositiveNumberOfSecondsIsAUsageError) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(refused(TuneOptions().time_budget(0), "--time-budget: must be a positive number of seconds, got 0"));
  EXPECT_TRUE(refused(TuneOptions().time_budget(-3), "--time-budget: must be a positive number of seconds, got -3"));
  EXPECT_TRUE(refused(TuneOptions().time_budget(std::nan("")), "--time-budget: must be a positive number of seconds, got nan"));
  EXPECT_TRUE(refused(TuneOptions().time_budget(inf), "--time-budget: must be a positive number of seconds, got inf"));
  EXPECT_TRUE(refused(TuneOptions().memory_budget_mb(-1), "--memory-budget: must be a number of MB, 0 for any, got -1"));
  EXPECT_TRUE(refused(TuneOptions().rounds(0), "--rounds: must be at least 1, got 0"));
  EXPECT_NO_THROW(validate(TuneOptions().time_budget(0.01)));
  // Nothing is loaded before the check: the data directory does not exist.
  train::TrainConfig config;
  config.data = "/nonexistent";
  EXPECT_THROW(tune_throughput(config, TuneOptions().time_budget(0)), UsageError);
  config.target_accuracy = 0.9;
  EXPECT_THROW(tune_time_to_accuracy(config, TuneOptions().time_budget(0)), UsageError);
}

}  // namespace
}  // namespace afterburner::tune
