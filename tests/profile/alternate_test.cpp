// spread_of and time_alternately: the statistics of known samples, and the call order that
// puts machine noise on both steps.
#include "afterburner/profile/alternate.h"

#include <gtest/gtest.h>

#include <string>

namespace afterburner::profile {
namespace {

TEST(Alternate, SpreadOfKnownSamples) {
  const Milliseconds odd = spread_of({5, 1, 3});
  EXPECT_EQ(odd.median, 3);
  EXPECT_EQ(odd.min, 1);
  EXPECT_EQ(odd.max, 5);
  const Milliseconds even = spread_of({4, 1, 10, 2});
  EXPECT_EQ(even.median, 3);  // mean of the middle two
  EXPECT_EQ(even.max, 10);
}

TEST(Alternate, WarmsUpThenAlternatesTheSteps) {
  std::string calls;
  auto [a, b] = time_alternately([&] { calls += 'a'; }, [&] { calls += 'b'; }, 3, 1);
  EXPECT_EQ(calls, "abababab");
  EXPECT_LE(a.min, a.median);
  EXPECT_LE(b.median, b.max);
}

}  // namespace
}  // namespace afterburner::profile
