// Errors: one exception type per area, each carrying what it concerns (a file, a field,
// a request) so the CLI can print a single line and exit with the right code.
//
//   try {
//     auto train = afterburner::data::load_mnist(dir, afterburner::data::Split::train);
//   } catch (const afterburner::Error& e) {
//     std::cerr << "afterburner: " << e.what() << "\n";   // "<file>: bad magic ..."
//     return e.exit_code();
//   }
#pragma once

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

namespace afterburner {

// `text` with its control characters but tab written as \xNN: bad input quoted in a message
// (a parser echoing the bytes it choked on, a newline among them) cannot break it over lines.
inline std::string one_line(const std::string& text) {
  std::string line;
  line.reserve(text.size());
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      line += escaped;
    } else {
      line += static_cast<char>(c);
    }
  }
  return line;
}

// The first line of `e`'s message, without LibTorch's C++ backtrace: what a one-line error
// quotes when it passes on why LibTorch refused something. For an error the TorchScript
// interpreter passes on, the failing op's own error, which its message ends with (without
// "RuntimeError: "), rather than the traceback it opens with.
std::string first_line(const std::exception& e);

// Base of every error afterburner raises on purpose. what() is one line, whatever it quotes.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(one_line(message)) {}
  // 2 for a usage error (bad flag or option value), 1 for anything else.
  virtual int exit_code() const { return 1; }
};

// A bad option or configuration value: exit code 2.
class UsageError : public Error {
 public:
  UsageError(const std::string& field, const std::string& problem)
      : Error(field + ": " + problem), problem_(problem) {}
  int exit_code() const override { return 2; }
  const std::string& problem() const { return problem_; }

 private:
  std::string problem_;
};

// A dataset file that is missing, truncated or malformed.
class DataError : public Error {
 public:
  DataError(const std::string& file, const std::string& problem)
      : Error(file + ": " + problem) {}
};

// A checkpoint that cannot be written, read, or does not fit the run resuming from it.
class CheckpointError : public Error {
 public:
  CheckpointError(const std::string& file, const std::string& problem)
      : Error(file + ": " + problem) {}
};

// The user stopped the work (Ctrl-C): exit code 130, as a shell reports a SIGINT.
class Interrupted : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 130; }
};

// Training cannot go on (for example a NaN loss), naming the step.
class TrainingError : public Error {
 public:
  using Error::Error;
};

}  // namespace afterburner
