#include "server_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>
#include <stdexcept>
#include <thread>

#include "testing.h"

namespace afterburner::serve::testing {

ServerProcess::ServerProcess(const std::vector<std::string>& args, std::chrono::seconds start_timeout) {
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> argv{afterburner::testing::cli_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> pointers;
    for (auto& arg : argv) pointers.push_back(arg.data());
    pointers.push_back(nullptr);
    execv(pointers[0], pointers.data());
    _exit(127);
  }
  close(out[1]);
  stdout_fd_ = out[0];
  const std::regex serving("afterburner: serving .* on http://[0-9.]+:([0-9]+)");
  const auto deadline = std::chrono::steady_clock::now() + start_timeout;
  std::string printed;
  std::smatch match;
  while (!std::regex_search(printed, match, serving)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd readable{stdout_fd_, POLLIN, 0};
    char chunk[4096];
    ssize_t n = left.count() > 0 && poll(&readable, 1, static_cast<int>(left.count())) > 0
                    ? read(stdout_fd_, chunk, sizeof chunk)
                    : -1;
    if (n <= 0) {
      stop();
      throw std::runtime_error("afterburner serve did not start (exit " + std::to_string(exit_code_) + "): " + printed);
    }
    printed.append(chunk, static_cast<size_t>(n));
  }
  port_ = std::stoi(match[1]);
  if (std::regex_search(printed, match, std::regex("afterburner: gRPC on [0-9.]+:([0-9]+)"))) {
    grpc_port_ = std::stoi(match[1]);
  }
}

ServerProcess::~ServerProcess() { stop(); }

int ServerProcess::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    pid_ = -1;
    close(stdout_fd_);
  }
  return exit_code_;
}

}  // namespace afterburner::serve::testing
