#include "afterburner/dist/group.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "afterburner/core/signals.h"

namespace afterburner::dist {
namespace {

// Python's names (torch/distributed/distributed_c10d.py at 1.13): the default group's store
// prefix, the first group's name, and the key of the barrier that ends init_process_group.
constexpr const char* kDefaultGroupPrefix = "default_pg";
constexpr const char* kFirstGroupName = "0";
constexpr const char* kInitBarrierKey = "store_based_barrier_key:1";

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int64_t integer_variable(const char* name, int64_t fallback) {
  auto text = variable(name);
  if (!text) return fallback;
  try {
    size_t used = 0;
    int64_t value = std::stoll(*text, &used);
    if (used == text->size()) return value;
  } catch (const std::exception&) {
  }
  throw UsageError(name, fmt::format("expected an integer, got '{}'", *text));
}

void check(const GroupOptions& o) {
  if (o.world_size() < 1) throw UsageError("world size", fmt::format("must be at least 1 (got {})", o.world_size()));
  if (o.rank() < 0 || o.rank() >= o.world_size()) {
    throw UsageError("rank", fmt::format("{} is outside a world of {} (ranks 0 to {})", o.rank(), o.world_size(),
                                         o.world_size() - 1));
  }
  if (o.master_port() < 1 || o.master_port() > 65535) {
    throw UsageError("master port", fmt::format("{} is not a TCP port (1 to 65535)", o.master_port()));
  }
}

std::string address(const GroupOptions& o) { return fmt::format("{}:{}", o.master_addr(), o.master_port()); }

c10::intrusive_ptr<c10d::Store> connect_store(const GroupOptions& o) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(o.master_port());
  store_options.isServer = !o.agent_store() && o.rank() == 0;
  store_options.numWorkers = static_cast<std::size_t>(o.world_size());
  store_options.waitWorkers = true;
  store_options.timeout = o.timeout();
  store_options.multiTenant = !o.agent_store();
  try {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(o.master_addr(), store_options);
    if (o.agent_store()) store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("/worker/attempt_{}", o.restart_count()), store);
    return c10::make_intrusive<c10d::PrefixStore>(kDefaultGroupPrefix, store);
  } catch (const std::exception& e) {
    if (first_line(e).find("in use") != std::string::npos) {
      throw DistError(fmt::format("{}: the rendezvous port is already in use (choose another with --master-port)", address(o)));
    }
    throw;
  }
}

// init_process_group's last step: every rank adds itself to one key and waits for the world.
void store_barrier(c10d::Store& store, const GroupOptions& o) {
  store.add(kInitBarrierKey, 1);
  const auto deadline = std::chrono::steady_clock::now() + o.timeout();
  for (int64_t arrived = store.add(kInitBarrierKey, 0); arrived < o.world_size(); arrived = store.add(kInitBarrierKey, 0)) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw DistError(fmt::format("{}: only {} of {} ranks joined within {} s", address(o), arrived, o.world_size(),
                                  o.timeout().count() / 1000.0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// This machine's address on the route to `host` (a UDP connect sends nothing): where the ranks
// that reach the master reach this one. Empty when the route cannot be found.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "";
  std::string local;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    char text[NI_MAXHOST];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&address), size, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0) {
      local = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return local;
}

// The interface Gloo listens on: GLOO_SOCKET_IFNAME's, as in Python; else the one on the route to
// the master. (c10d's default resolves the hostname, which on a machine whose hostname maps to
// no address of its own, or in a network namespace, falls back to loopback: unreachable.)
std::shared_ptr<gloo::transport::Device> gloo_device(const GroupOptions& o) {
  if (auto interface = variable("GLOO_SOCKET_IFNAME")) return c10d::ProcessGroupGloo::createDeviceForInterface(*interface);
  const std::string local = local_address_towards(o.master_addr());
  if (local.empty()) return c10d::ProcessGroupGloo::createDefaultDevice();
  return c10d::ProcessGroupGloo::createDeviceForHostname(local);
}


// Gloo writes to its peers with writev, which cannot pass MSG_NOSIGNAL: a write to a rank that
// died raises SIGPIPE, whose default action ends this process without a word where Gloo would
// have thrown "Connection reset by peer" (Python ignores SIGPIPE at startup, C++ programs do not).
// An empty handler rather than SIG_IGN, so programs this process executes get the default back;
// a handler the program installed itself is left alone.
void survive_broken_pipes() {
  struct sigaction current {};
  sigaction(SIGPIPE, nullptr, &current);
  if (current.sa_handler != SIG_DFL) return;
  handle_signal(SIGPIPE, [](int) {}, SA_RESTART);
}

}  // namespace

std::optional<GroupOptions> options_from_environment() {
  if (!variable("RANK") || !variable("WORLD_SIZE")) return std::nullopt;
  GroupOptions o;
  o.rank(integer_variable("RANK", 0)).world_size(integer_variable("WORLD_SIZE", 1));
  o.master_addr(variable("MASTER_ADDR").value_or(o.master_addr()));
  o.master_port(integer_variable("MASTER_PORT", o.master_port()));
  o.agent_store(variable("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True"));
  o.restart_count(integer_variable("TORCHELASTIC_RESTART_COUNT", 0));
  check(o);
  return o;
}

Group join_group(const GroupOptions& options) {
  check(options);
  survive_broken_pipes();
  Group group;
  group.rank = options.rank();
  group.world_size = options.world_size();
  try {
    group.store = connect_store(options);
    auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout());
    gloo->devices.push_back(gloo_device(options));
    auto process_group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>(kFirstGroupName, group.store), static_cast<int>(options.rank()),
        static_cast<int>(options.world_size()), gloo);
    store_barrier(*group.store, options);
    // Rank 0 sets the group's sequence number in the store and the others read it, as Python does.
    process_group->setSequenceNumberForGroup();
    group.process_group = process_group;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DistError(fmt::format("{}: rank {} of {} could not join the job within {} s: {}", address(options),
                                options.rank(), options.world_size(), options.timeout().count() / 1000.0, first_line(e)));
  }
  return group;
}

}  // namespace afterburner::dist
