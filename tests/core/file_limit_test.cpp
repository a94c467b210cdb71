#include "afterburner/core/file_limit.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

namespace afterburner {
namespace {

rlimit current() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit;
}

// Lowers the soft limit for the test and puts it back after.
class LoweredSoftLimit {
 public:
  explicit LoweredSoftLimit(rlim_t soft) : saved_(current()) {
    rlimit lowered = saved_;
    lowered.rlim_cur = soft;
    setrlimit(RLIMIT_NOFILE, &lowered);
  }
  ~LoweredSoftLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_;
};

TEST(OpenFileLimit, RaisesTheSoftLimitUpToTheHardOne) {
  const rlim_t hard = current().rlim_max;
  ASSERT_GT(hard, 300u) << "the machine's hard limit leaves nothing to test";
  LoweredSoftLimit lowered(256);
  EXPECT_EQ(raise_open_file_limit(300), 300u);
  EXPECT_EQ(current().rlim_cur, 300u);
  EXPECT_EQ(raise_open_file_limit(100), 300u);  // never lowered
  EXPECT_EQ(current().rlim_cur, 300u);
  if (hard != RLIM_INFINITY) {
    EXPECT_EQ(raise_open_file_limit(hard + 1000), hard);
    EXPECT_EQ(current().rlim_cur, hard);
  }
}

}  // namespace
}  // namespace afterburner
