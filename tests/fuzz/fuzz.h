// What every fuzz target shares: the rule that decides what a finding is. Parsers that read a
// path get the input through a file in a testing::TempDir.
//
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     static const afterburner::testing::TempDir dir;
//     afterburner::testing::write_file(dir / "input.idx", afterburner::fuzz::bytes(data, size));
//     afterburner::fuzz::expect_clean_errors([&] { afterburner::data::read_idx(dir / "input.idx"); });
//     return 0;
//   }
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "afterburner/core/error.h"
#include "testing.h"

namespace afterburner::fuzz {

inline std::string bytes(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

// Prints `what` (control and non-ASCII bytes escaped) and aborts: libFuzzer saves the input.
[[noreturn]] inline void finding(const std::string& what) {
  std::string printable;
  for (unsigned char c : what) printable += c >= 0x20 && c < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", c);
  std::fprintf(stderr, "==afterburner-fuzz== %s\n", printable.c_str());
  std::abort();
}

// Bad input must end in an afterburner::Error with a one-line message (the project's rule for
// outside input). Sanitizer reports, crashes, hangs, any other exception or a message over
// several lines are findings.
template <typename Parse>
void expect_clean_errors(Parse&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.find('\n') != std::string::npos) finding("error message over several lines: " + message);
  } catch (const std::exception& e) {
    finding(std::string("escaped ") + typeid(e).name() + ": " + e.what());
  }
}

}  // namespace afterburner::fuzz
