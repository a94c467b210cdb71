// handle_signal and the alternate signal stacks it installs handlers on (tests/kernels/
// gemm_signals_test.cpp signals oneDNN's GEMM, the reason for them).
#include "afterburner/core/signals.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "afterburner/core/error.h"

namespace afterburner {
namespace {

extern "C" void do_nothing(int) {}

TEST(HandleSignal, ReturnsTheActionItReplaced) {
  const struct sigaction original = handle_signal(SIGUSR1, do_nothing, SA_RESTART);
  struct sigaction installed {};
  sigaction(SIGUSR1, nullptr, &installed);
  EXPECT_EQ(installed.sa_handler, do_nothing);
  EXPECT_TRUE(installed.sa_flags & SA_ONSTACK);
  EXPECT_TRUE(installed.sa_flags & SA_RESTART);
  const struct sigaction replaced = handle_signal(SIGUSR1, SIG_IGN);
  EXPECT_EQ(replaced.sa_handler, do_nothing);
  sigaction(SIGUSR1, &original, nullptr);
}

TEST(HandleSignal, RefusesWhatSigactionRefusesNamingTheSignal) {
  try {
    handle_signal(SIGKILL, do_nothing);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "signal 9 (Killed): sigaction failed: Invalid argument");
  }
}

TEST(EnsureAlternateSignalStack, GivesAThreadItsOwnAndKeepsOneItHad) {
  std::thread([] {
    stack_t before{}, after{};
    sigaltstack(nullptr, &before);  // none, but AddressSanitizer gives every thread one
    ensure_alternate_signal_stack();
    sigaltstack(nullptr, &after);
    EXPECT_FALSE(after.ss_flags & SS_DISABLE);
    if (before.ss_flags & SS_DISABLE) {
      EXPECT_GE(after.ss_size, 64u * 1024);
    } else {
      EXPECT_EQ(after.ss_sp, before.ss_sp);
    }
  }).join();

  std::thread([] {
    std::vector<char> own(128 * 1024);
    stack_t mine{}, after{};
    mine.ss_sp = own.data();
    mine.ss_size = own.size();
    ASSERT_EQ(sigaltstack(&mine, nullptr), 0);
    ensure_alternate_signal_stack();
    sigaltstack(nullptr, &after);
    EXPECT_EQ(after.ss_sp, own.data());
    stack_t disable{};
    disable.ss_flags = SS_DISABLE;
    sigaltstack(&disable, nullptr);  // before `own` goes
  }).join();
}

}  // namespace
}  // namespace afterburner
