// Helpers shared by the tests: temporary directories, the real dataset, running the CLI.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace afterburner::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Where Debian's dataset-fashion-mnist installs the IDX files.
std::filesystem::path fashion_mnist_dir();

// The source tree (for scripts and fixtures) and the built CLI, as ctest passes them.
std::filesystem::path source_dir();
std::filesystem::path cli_binary();

struct CommandResult {
  int exit_code = -1;
  std::string out;  // standard output
  std::string err;  // standard error
};

// Runs a program with arguments (no shell), capturing both streams.
CommandResult run(const std::vector<std::string>& argv);

// Runs the afterburner CLI with arguments.
CommandResult run_cli(const std::vector<std::string>& args);

// The CLI as a child process, with both streams in `log`; killed and reaped if the test ends early.
class CliProcess {
 public:
  CliProcess(const std::vector<std::string>& args, const std::filesystem::path& log);
  ~CliProcess();
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;

  // Waits up to `timeout` for `text` in the log and returns the log; throws std::runtime_error
  // with the log if the process exits or the time passes first.
  std::string wait_for(const std::string& text, std::chrono::seconds timeout = std::chrono::seconds(60));
  // Sends `signal` and waits for the exit: its code, 128 + the signal that killed it.
  int stop(int signal = SIGTERM);

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

// The configuration a dashboard page (monitor/dashboard.h) runs with, read back from its script.
nlohmann::json dashboard_config(const std::string& page);

// Writes bytes to a file, creating or truncating it.
void write_file(const std::filesystem::path& path, const std::string& bytes);
std::string read_file(const std::filesystem::path& path);

inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// The message of the ErrorType that `action` throws; a test failure if it throws none.
template <typename ErrorType>
std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const ErrorType& e) {
    return e.what();
  }
  ADD_FAILURE() << "nothing thrown";
  return "";
}

}  // namespace afterburner::testing
