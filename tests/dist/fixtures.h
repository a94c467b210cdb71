// What the distributed tests share: environment variables set for the length of a scope
// (torchrun's, for a rank the test starts), a port someone listens on, and ranks started as
// processes of the test binary itself.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "afterburner/dist/launch.h"
#include "testing.h"

namespace afterburner::dist {

class ScopedEnvironment {
 public:
  ScopedEnvironment() = default;
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;
  ~ScopedEnvironment() {
    for (const auto& name : names_) unsetenv(name.c_str());
  }
  void set(const std::string& name, const std::string& value) {
    names_.push_back(name);
    setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::vector<std::string> names_;
};

// A listening TCP socket on a port the kernel chose; closing it frees the port for the test.
class Listener {
 public:
  Listener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), size), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size), 0);
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// Runs this test binary's `rank_test` (a test that skips unless AFTERBURNER_TEST_RANK is set) as
// ranks 0 and 1, each in its own process, with `settings(rank)` ("NAME=value") as its environment
// and a free port as AFTERBURNER_TEST_PORT. free_port's port is free when it looks, but another
// process's connection can take it (outgoing connections get ports from the same range) before
// rank 0 listens on it: then the job runs again on another port, up to three times.
inline std::vector<testing::CommandResult> run_ranks(const std::string& rank_test,
                                                     const std::function<std::vector<std::string>(int)>& settings) {
  std::vector<testing::CommandResult> results;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int64_t port = free_port("127.0.0.1");
    std::vector<std::future<testing::CommandResult>> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.push_back(std::async(std::launch::async, [&, rank] {
        std::vector<std::string> argv{"/usr/bin/env", fmt::format("AFTERBURNER_TEST_RANK={}", rank),
                                      fmt::format("AFTERBURNER_TEST_PORT={}", port)};
        for (const auto& setting : settings(rank)) argv.push_back(setting);
        argv.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
        argv.push_back("--gtest_filter=" + rank_test);
        return testing::run(argv);
      }));
    }
    results.clear();
    for (auto& rank : ranks) results.push_back(rank.get());
    const bool port_taken = std::any_of(results.begin(), results.end(), [](const testing::CommandResult& r) {
      return testing::Contains(r.out, "the rendezvous port is already in use");
    });
    if (!port_taken) break;
  }
  return results;
}

}  // namespace afterburner::dist
