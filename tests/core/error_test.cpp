// Errors are one line whatever they quote: control characters are escaped, the rest kept.
#include <gtest/gtest.h>

#include <torch/script.h>

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

// LibTorch's messages lose their C++ backtrace; the TorchScript interpreter's, its traceback of
// TorchScript code, keeping the failing op's own error, the same words as when called directly.
TEST(Error, FirstLineOfALibTorchErrorSaysWhatWentWrong) {
  try {
    torch::zeros({2, 3}).mm(torch::zeros({4, 5}));
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_EQ(first_line(e), "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
  }
  torch::jit::Module module("M");
  module.define("def forward(self, x):\n  return x.mm(x)\n");
  try {
    module.forward({torch::zeros({2, 3})});
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_EQ(first_line(e), "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)");
  }
}

}  // namespace
}  // namespace afterburner
