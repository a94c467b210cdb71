// The learning-rate range test: a geometric sweep, the moving average recomputed independently,
// the suggestion, the cut where the loss diverges, and the same curve from a second call.
#include <gtest/gtest.h>

#include <cmath>

#include "afterburner/core/error.h"
#include "afterburner/train/session.h"
#include "afterburner/tune/lr_find.h"
#include "recipes.h"
#include "testing.h"

namespace afterburner::tune {
namespace {

using testing_recipes::small_mlp;

TEST(LrFind, SweepsGeometricallySmoothsTheLossAndCutsWhereItDiverges) {
  const auto config = small_mlp();
  const auto data = train::load_training_data(config);
  const auto options = LrFindOptions().min_lr(1e-4).max_lr(1e3).steps(60);
  const auto found = find_lr(config, data, options);
  ASSERT_GE(found.lrs.size(), 10u);
  EXPECT_LT(found.lrs.size(), 60u) << "an lr of 1000 diverges: " << found.stop_reason;
  EXPECT_TRUE(testing::Contains(found.stop_reason, found.stop_reason.find("diverged") != std::string::npos
                                                       ? "diverged"
                                                       : "not finite"));
  ASSERT_EQ(found.losses.size(), found.lrs.size());
  ASSERT_EQ(found.smoothed.size(), found.lrs.size());
  // A fresh 10-class model starts near ln 10.
  EXPECT_NEAR(found.losses.front(), std::log(10.0), 0.3);
  double average = 0, lowest = INFINITY, argmin = 0;
  for (size_t i = 0; i < found.lrs.size(); ++i) {
    EXPECT_NEAR(found.lrs[i], 1e-4 * std::pow(1e7, double(i) / 59.0), 1e-9 * found.lrs[i]) << i;
    average = 0.98 * average + 0.02 * found.losses[i];
    const double smoothed = average / (1 - std::pow(0.98, double(i + 1)));
    EXPECT_NEAR(found.smoothed[i], smoothed, 1e-9) << i;
    if (smoothed < lowest) {
      lowest = smoothed;
      argmin = found.lrs[i];
    }
  }
  EXPECT_LT(lowest, found.losses.front()) << "the sweep learned nothing";
  EXPECT_EQ(found.min_loss_lr, argmin);
  EXPECT_DOUBLE_EQ(found.suggestion, argmin / 10);

  const auto again = find_lr(config, data, options);
  EXPECT_EQ(again.losses, found.losses);
  EXPECT_EQ(again.suggestion, found.suggestion);
}

TEST(LrFind, ASweepThatDoesNotRiseIsAUsageError) {
  const auto config = small_mlp();
  const auto data = train::load_training_data(config);
  for (const auto& options : {LrFindOptions().min_lr(0), LrFindOptions().min_lr(1).max_lr(0.5), LrFindOptions().steps(1)}) {
    EXPECT_THROW(find_lr(config, data, options), UsageError);
  }
}

}  // namespace
}  // namespace afterburner::tune
