#include "afterburner/dist/launch.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "afterburner/core/error.h"
#include "afterburner/core/signals.h"
#include "afterburner/dist/group.h"

extern char** environ;

namespace afterburner::dist {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);
constexpr auto kKillAfterTerm = std::chrono::seconds(5);

// The launched ranks' pids, for the signal handler (which may only call async-signal-safe kill).
constexpr int kMaxRanks = 1024;
pid_t rank_pids[kMaxRanks];
volatile sig_atomic_t rank_count = 0;
volatile sig_atomic_t interrupted = 0;  // a SIGINT was forwarded

void forward_signal(int signal) {
  if (signal == SIGINT) interrupted = 1;
  for (int i = 0; i < rank_count; ++i) {
    if (rank_pids[i] > 0) kill(rank_pids[i], signal);
  }
}

// Restores the previous handlers of SIGINT and SIGTERM when the launch ends.
class ForwardSignals {
 public:
  ForwardSignals() {
    interrupted = 0;
    previous_int_ = handle_signal(SIGINT, forward_signal);
    previous_term_ = handle_signal(SIGTERM, forward_signal);
  }
  ~ForwardSignals() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
    rank_count = 0;
  }
  ForwardSignals(const ForwardSignals&) = delete;
  ForwardSignals& operator=(const ForwardSignals&) = delete;

 private:
  struct sigaction previous_int_ {}, previous_term_ {};
};

// Local rank `local` of `nproc` gets an equal, contiguous share of the cores this process may use
// (one core, round robin, when there are more ranks than cores).
cpu_set_t core_share(int64_t local, int64_t nproc) {
  cpu_set_t allowed, share;
  CPU_ZERO(&share);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return allowed;
  std::vector<int> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cores.push_back(cpu);
  }
  const auto count = static_cast<int64_t>(cores.size());
  if (count < nproc) {
    CPU_SET(cores[local % count], &share);
  } else {
    for (int64_t i = local * count / nproc; i < (local + 1) * count / nproc; ++i) CPU_SET(cores[i], &share);
  }
  return share;
}

// This environment with torchrun's variables for one rank, as "NAME=value" strings.
std::vector<std::string> rank_environment(const LaunchOptions& options, int64_t local, int64_t port, int threads) {
  std::vector<std::pair<std::string, std::string>> variables{
      {"RANK", std::to_string(options.node_rank() * options.nproc() + local)},
      {"LOCAL_RANK", std::to_string(local)},
      {"WORLD_SIZE", std::to_string(options.nnodes() * options.nproc())},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc())},
      {"GROUP_RANK", std::to_string(options.node_rank())},
      {"MASTER_ADDR", options.master_addr()},
      {"MASTER_PORT", std::to_string(port)}};
  if (std::getenv("OMP_NUM_THREADS") == nullptr) variables.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
  std::vector<std::string> environment;
  for (char** entry = environ; *entry; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    const bool replaced = std::any_of(variables.begin(), variables.end(), [&](const auto& v) { return v.first == name; });
    if (!replaced) environment.push_back(text);
  }
  for (const auto& [name, value] : variables) environment.push_back(name + "=" + value);
  return environment;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (auto& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

// Forks and executes one rank; between fork and exec only async-signal-safe calls.
pid_t start_rank(std::vector<std::string> command, std::vector<std::string> environment, const cpu_set_t& cores) {
  auto argv = pointers(command);
  auto envp = pointers(environment);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw DistError(fmt::format("cannot start a rank: fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // a rank never outlives its launcher
    if (getppid() != parent) _exit(1);
    sched_setaffinity(0, sizeof(cores), &cores);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

std::string describe_end(int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  if (WEXITSTATUS(status) == 127) return "could not be started (exit code 127)";
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

// Binds a TCP socket to address:port (0: the kernel's choice), returns the port and closes it.
int64_t bind_port(const std::string& address, int64_t port) {
  sockaddr_in socket_address{};
  socket_address.sin_family = AF_INET;
  socket_address.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &socket_address.sin_addr) != 1) {
    throw UsageError("--master-addr", fmt::format("'{}' is not an IPv4 address", address));
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw DistError(fmt::format("cannot open a socket: {}", std::strerror(errno)));
  socklen_t length = sizeof(socket_address);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&socket_address), sizeof(socket_address)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&socket_address), &length) == 0;
  const int error = errno;
  close(fd);
  if (bound) return ntohs(socket_address.sin_port);
  if (error == EADDRINUSE) {
    throw DistError(fmt::format("{}:{}: the rendezvous port is already in use (choose another with --master-port)",
                                address, port));
  }
  throw DistError(fmt::format("cannot listen on {}:{}: {}", address, port, std::strerror(error)));
}

}  // namespace

std::vector<std::string> current_command() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> words;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\0', begin);
    words.push_back(text.substr(begin, end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  if (words.empty()) throw DistError("cannot read this process's command line from /proc/self/cmdline");
  words[0] = std::filesystem::read_symlink("/proc/self/exe").string();
  return words;
}

int64_t free_port(const std::string& address) { return bind_port(address, 0); }

void launch_local_ranks(const std::vector<std::string>& command, const LaunchOptions& options) {
  if (options.nproc() < 1 || options.nproc() > kMaxRanks) {
    throw UsageError("--nproc", fmt::format("must be between 1 and {}, got {}", kMaxRanks, options.nproc()));
  }
  if (options.node_rank() < 0 || options.node_rank() >= options.nnodes()) {
    throw UsageError("--node-rank", fmt::format("must be in [0, {}), got {}", options.nnodes(), options.node_rank()));
  }
  int64_t port = options.master_port();
  if (port == 0 && options.nnodes() > 1) throw UsageError("--master-port", "must be given for a job on several machines");
  // On one machine rank 0 will listen here: a port taken is one line now, not a rank failing later.
  if (options.nnodes() == 1) port = bind_port(options.master_addr(), port);
  ForwardSignals forward;
  for (int64_t local = 0; local < options.nproc(); ++local) {
    const cpu_set_t cores = core_share(local, options.nproc());
    rank_pids[local] = start_rank(command, rank_environment(options, local, port, CPU_COUNT(&cores)), cores);
    rank_count = static_cast<sig_atomic_t>(local + 1);
  }
  const int64_t first_rank = options.node_rank() * options.nproc();
  std::optional<std::string> failure;
  bool stopped_by_interrupt = true;  // every rank that failed exited 130, as train does after Ctrl-C
  constexpr auto kNever = std::chrono::steady_clock::time_point::max();
  auto terminate_at = kNever, kill_at = kNever;
  for (int64_t running = options.nproc(); running > 0;) {
    for (int64_t local = 0; local < options.nproc(); ++local) {
      int status = 0;
      if (rank_pids[local] == 0 || waitpid(rank_pids[local], &status, WNOHANG) != rank_pids[local]) continue;
      --running;
      if (failed(status)) stopped_by_interrupt = stopped_by_interrupt && WIFEXITED(status) && WEXITSTATUS(status) == 130;
      if (failed(status) && !failure) {
        failure = fmt::format("rank {} (pid {}) {}", first_rank + local, rank_pids[local], describe_end(status));
        terminate_at = std::chrono::steady_clock::now() + options.grace();
      }
      rank_pids[local] = 0;
    }
    if (running == 0) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= terminate_at) {
      forward_signal(SIGTERM);
      forward_signal(SIGCONT);  // a stopped rank receives its SIGTERM only once it runs
      terminate_at = kNever;
      kill_at = now + kKillAfterTerm;
    }
    if (now >= kill_at) {
      forward_signal(SIGKILL);
      kill_at = kNever;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  if (failure && interrupted && stopped_by_interrupt) {
    throw Interrupted("the job stopped after Ctrl-C; rank 0 said above what it kept");
  }
  if (failure) throw DistError(*failure + "; the job stopped");
}

}  // namespace afterburner::dist
