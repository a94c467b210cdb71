// Local ranks started as torchrun starts them: `nproc` copies of a command, each with torchrun's
// variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), pinned to
// its own share of this process's cores with OMP_NUM_THREADS the share's size (unless set), then
// supervised until all have exited.
//
//   afterburner::dist::launch_local_ranks(afterburner::dist::current_command(),
//                                         afterburner::dist::LaunchOptions().nproc(2));
//   // returns once both ranks succeeded; else throws DistError "rank 1 (pid 4242) was killed by signal 9 ..."
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace afterburner::dist {

struct LaunchOptions {
  TORCH_ARG(int64_t, nproc) = 1;      // ranks on this machine
  TORCH_ARG(int64_t, nnodes) = 1;     // machines; each runs its own launcher
  TORCH_ARG(int64_t, node_rank) = 0;  // this machine's ranks are node_rank * nproc + 0 .. nproc - 1
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int64_t, master_port) = 0;  // 0: a free port of master_addr, on one machine only
  // After a rank fails, how long the others get to notice and exit on their own (each printing
  // its own line) before they are terminated.
  TORCH_ARG(std::chrono::milliseconds, grace) = std::chrono::seconds(10);
};

// This process's command line (from /proc/self/cmdline), its first word this executable's path.
std::vector<std::string> current_command();

// A TCP port nobody listens on at `address` now (the kernel's choice).
int64_t free_port(const std::string& address);

// Starts the ranks, forwards SIGINT and SIGTERM to them, and waits for all of them. Throws
// DistError naming the first rank that failed (exit code or signal) once every rank has ended;
// Interrupted when Ctrl-C stopped them (each exited 130); UsageError for options that make no job.
void launch_local_ranks(const std::vector<std::string>& command, const LaunchOptions& options);

}  // namespace afterburner::dist
