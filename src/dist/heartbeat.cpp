#include "heartbeat.h"

#include <fmt/format.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace afterburner::dist {
namespace {

constexpr auto kBeat = std::chrono::seconds(1);
constexpr auto kWatch = std::chrono::milliseconds(2500);  // 2.5 beats: a live rank moves
constexpr auto kStoreAnswer = std::chrono::seconds(3);

std::string key_of(int64_t rank) { return fmt::format("afterburner/heartbeat/{}", rank); }

}  // namespace

// Shared with the beating thread, which may outlive the Heartbeat while stuck on the store.
struct Heartbeat::State {
  c10::intrusive_ptr<c10d::Store> store;
  int64_t rank = 0, world_size = 1;
  std::string store_owner;  // who is gone when the store is
  std::mutex mutex;
  std::condition_variable stop_requested;
  bool stop = false;

  std::vector<int64_t> counters() const {
    std::vector<int64_t> values;
    for (int64_t r = 0; r < world_size; ++r) values.push_back(store->add(key_of(r), 0));
    return values;
  }
};

Heartbeat::Heartbeat(const Group& group, bool rank0_serves_store) : state_(std::make_shared<State>()) {
  state_->store = group.store;
  state_->store_owner = rank0_serves_store ? "rank 0, which serves the rendezvous store," : "the rendezvous store";
  state_->rank = group.rank;
  state_->world_size = group.world_size;
  std::thread([state = state_] {
    std::unique_lock<std::mutex> lock(state->mutex);
    while (!state->stop) {
      lock.unlock();
      try {
        state->store->add(key_of(state->rank), 1);
      } catch (const std::exception&) {
        return;  // the store is gone: silent_ranks() says so
      }
      lock.lock();
      state->stop_requested.wait_for(lock, kBeat, [&] { return state->stop; });
    }
  }).detach();
}

Heartbeat::~Heartbeat() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->stop = true;
  state_->stop_requested.notify_all();
}

std::string Heartbeat::silent_ranks() const {
  // On a thread of its own, so that a store that does not answer cannot hold this rank past a
  // few seconds; the thread is left behind when it does not come back.
  auto result = std::make_shared<std::promise<std::vector<int64_t>>>();
  auto answer = result->get_future();
  std::thread([state = state_, result] {
    try {
      auto before = state->counters();
      std::this_thread::sleep_for(kWatch);
      auto after = state->counters();
      std::vector<int64_t> silent;
      for (int64_t r = 0; r < state->world_size; ++r) {
        if (r != state->rank && after[r] == before[r]) silent.push_back(r);
      }
      result->set_value(silent);
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }).detach();
  try {
    if (answer.wait_for(kWatch + 2 * kStoreAnswer) != std::future_status::ready) {
      return state_->store_owner + " stopped answering";
    }
    auto silent = answer.get();
    if (silent.empty()) return "";
    return fmt::format("{} {} stopped answering", silent.size() == 1 ? "rank" : "ranks", fmt::join(silent, ", "));
  } catch (const std::exception&) {
    return state_->store_owner + " is gone";
  }
}

}  // namespace afterburner::dist
