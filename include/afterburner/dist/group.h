// Joining a data-parallel job on PyTorch's own engine: rendezvous over c10d::TCPStore and
// collectives over c10d::ProcessGroupGloo, laid out in the store exactly as Python's
// torch.distributed.init_process_group("gloo") lays them out, so that afterburner ranks, Python
// ranks and torchrun can share one job.
//
//   auto options = afterburner::dist::options_from_environment()     // torchrun's variables
//                      .value_or(afterburner::dist::GroupOptions().world_size(2).rank(0));
//   afterburner::dist::Group group = afterburner::dist::join_group(options);
//   std::vector<torch::Tensor> tensors{grad};
//   group.process_group->allreduce(tensors)->wait();               // sums over the ranks
#pragma once

#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "afterburner/core/error.h"

namespace afterburner::dist {

struct GroupOptions {
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int64_t, master_port) = 29500;
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(int64_t, world_size) = 1;
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);  // of every store wait and collective
  // torchrun's store: its agent serves it, every rank is a client, keys under
  // /worker/attempt_<restart_count> (TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT).
  TORCH_ARG(bool, agent_store) = false;
  TORCH_ARG(int64_t, restart_count) = 0;
};

// From torchrun's variables: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and the agent store's.
// nullopt when RANK and WORLD_SIZE are not set; UsageError naming the variable for a bad value.
std::optional<GroupOptions> options_from_environment();

struct Group {
  c10::intrusive_ptr<c10d::Store> store;  // the job's store, under the group's prefix
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;
  int64_t rank = 0, world_size = 1;
};

// A rank, a world size or a port the job cannot use.
class DistError : public Error {
 public:
  using Error::Error;
};

// Connects to (rank 0: serves) the store, waits for every rank and builds the Gloo group. Throws
// UsageError for a rank outside the world or a bad port, DistError naming the address for a port
// in use or a job that does not assemble within the timeout. A rank that dies later makes the
// others' collectives throw (SIGPIPE is caught from here on, unless the program handles it).
Group join_group(const GroupOptions& options);

}  // namespace afterburner::dist
