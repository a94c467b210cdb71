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
#include <cstring>
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

// For targets that write their own seeds: given `flag` ("--write-seed=") with a path among the
// program's arguments (libFuzzer ignores those that start with "--"), calls write(path) and
// exits. Call from LLVMFuzzerInitialize.
template <typename Write>
void write_seeds_if_asked(int argc, char** argv, const char* flag, Write&& write) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag, std::strlen(flag)) == 0) {
      write(std::string(argv[i] + std::strlen(flag)));
      std::exit(0);
    }
  }
}

// For code that runs a user's model rather than parsing bytes: any exception is a clean refusal
// (LibTorch's own c10::Error for an op the model calls wrongly, passed on as it is); crashes,
// hangs and sanitizer reports are findings. Returns the refusal's first line, empty if `run` ran.
template <typename Run>
std::string expect_no_crash(Run&& run) {
  try {
    run();
  } catch (const std::exception& e) {
    const std::string refusal = first_line(e);
    return refusal.empty() ? typeid(e).name() : refusal;
  } catch (...) {
    finding("escaped an exception that is no std::exception");
  }
  return "";
}

}  // namespace afterburner::fuzz
