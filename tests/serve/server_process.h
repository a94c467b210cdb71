// `afterburner serve` as a child process, for end-to-end tests against the real executable.
//
//   ServerProcess server({"serve", "--repo", dir, "--port", "0"});   // waits for "serving ... on"
//   HttpClient client(server.port());
//   ...
//   EXPECT_EQ(server.stop(), 0);   // SIGTERM: finishes in-flight requests, exits 0
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace afterburner::serve::testing {

class ServerProcess {
 public:
  // Runs the CLI (AFTERBURNER_BINARY) with `args` and waits up to `start_timeout` for its line
  // "afterburner: serving <repo> on http://<host>:<port>". Throws std::runtime_error with what it
  // printed if it exits or stays silent instead.
  explicit ServerProcess(const std::vector<std::string>& args,
                         std::chrono::seconds start_timeout = std::chrono::seconds(120));
  ~ServerProcess();  // stop() if still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  // With --grpc-port: the gRPC port its "afterburner: gRPC on <host>:<port>" line named; else 0.
  int grpc_port() const { return grpc_port_; }
  // SIGTERM, then waits for the exit (SIGKILL after 60 s); returns the exit code, 128 + signal
  // if killed. Later calls return the same code.
  int stop();

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  int grpc_port_ = 0;
  int exit_code_ = -1;
};

}  // namespace afterburner::serve::testing
