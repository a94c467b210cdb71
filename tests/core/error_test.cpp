// Errors are one line whatever they quote: control characters are escaped, the rest kept.
#include <gtest/gtest.h>

#include "afterburner/core/error.h"

namespace afterburner {
namespace {

TEST(Error, QuotedControlCharactersAreEscapedOntoOneLine) {
  EXPECT_STREQ(Error("run.toml:1:12: expected 'true', saw 't\n'").what(), "run.toml:1:12: expected 'true', saw 't\\x0a'");
  EXPECT_STREQ(DataError("a\r\x7f.csv", "bad").what(), "a\\x0d\\x7f.csv: bad");
  EXPECT_EQ(UsageError("lr", std::string("x\0y", 3)).exit_code(), 2);
  EXPECT_STREQ(UsageError("lr", std::string("x\0y", 3)).what(), "lr: x\\x00y");
}

TEST(Error, TabsAndUtf8AreKept) {
  EXPECT_STREQ(Error("col\tumn: données é").what(), "col\tumn: données é");
}

}  // namespace
}  // namespace afterburner
