// TrainingSession::measure_steps, as tune's trials use it: a run at a sane rate times every step
// asked for; one whose loss turns inf or NaN stops there and says so, instead of a speed.
#include <gtest/gtest.h>

#include "afterburner/train/session.h"
#include "recipes.h"

namespace afterburner::tune {
namespace {

train::TrainConfig mlp_at(double lr) {
  train::TrainConfig config = testing_recipes::small_mlp();
  config.lr = lr;
  return config;
}

TEST(MeasureSteps, TimesEveryStepOfAStableRunAndFlagsADivergedOne) {
  const auto stable_config = mlp_at(0.01);
  const auto data = train::load_training_data(stable_config);
  train::TrainingSession stable(stable_config, data);
  const auto timed = stable.measure_steps(2, 5);
  EXPECT_FALSE(timed.diverged);
  EXPECT_EQ(timed.samples, 5 * 64);
  EXPECT_GT(timed.samples_per_sec, 0);

  train::TrainingSession exploding(mlp_at(1e8), data);
  const auto diverged = exploding.measure_steps(0, 50);
  EXPECT_TRUE(diverged.diverged);
  EXPECT_LT(diverged.samples, 50 * 64) << "the steps stop at the first loss that is not finite";
}

}  // namespace
}  // namespace afterburner::tune
