#include "afterburner/profile/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_legacy.h>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"

namespace afterburner::profile {

namespace legacy = torch::autograd::profiler;

void to_json(nlohmann::json& out, const OpStats& stats) {
  out = {{"name", stats.name},
         {"calls", stats.calls},
         {"self_us", stats.self_us},
         {"total_us", stats.total_us}};
}

namespace {

double end_us(const OpEvent& event) { return event.start_us + event.duration_us; }

// self_us = duration_us - (time covered by the events directly inside it), nesting per thread
// by time range: an event contains the later-starting events that start before it ends.
// Returns, per event, whether a call of the same name encloses it.
std::vector<bool> nest(std::vector<OpEvent>& events) {
  std::sort(events.begin(), events.end(), [](const OpEvent& a, const OpEvent& b) {
    return std::make_tuple(a.thread, a.start_us, -a.duration_us) <
           std::make_tuple(b.thread, b.start_us, -b.duration_us);
  });
  std::vector<double> nested_us(events.size(), 0.0);
  std::vector<bool> inside_same_name(events.size(), false);
  std::vector<size_t> open;  // indices of the events enclosing the current one, outermost first
  for (size_t i = 0; i < events.size(); ++i) {
    const OpEvent& event = events[i];
    if (i > 0 && events[i - 1].thread != event.thread) open.clear();
    while (!open.empty() && end_us(events[open.back()]) <= event.start_us) open.pop_back();
    if (!open.empty()) {
      size_t parent = open.back();
      nested_us[parent] += std::min(end_us(event), end_us(events[parent])) - event.start_us;
    }
    inside_same_name[i] = std::any_of(open.begin(), open.end(),
                                      [&](size_t outer) { return events[outer].name == event.name; });
    open.push_back(i);
  }
  for (size_t i = 0; i < events.size(); ++i) {
    // An async range (ended on another thread) may overlap its siblings: never go below zero.
    events[i].self_us = std::max(0.0, events[i].duration_us - nested_us[i]);
  }
  return inside_same_name;
}

std::vector<OpStats> stats_by_self_time(const std::vector<OpEvent>& events,
                                        const std::vector<bool>& inside_same_name) {
  std::unordered_map<std::string, OpStats> by_name;
  for (size_t i = 0; i < events.size(); ++i) {
    OpStats& stats = by_name[events[i].name];
    stats.name = events[i].name;
    stats.calls += 1;
    stats.self_us += events[i].self_us;
    if (!inside_same_name[i]) stats.total_us += events[i].duration_us;
  }
  std::vector<OpStats> ops;
  ops.reserve(by_name.size());
  for (auto& entry : by_name) ops.push_back(std::move(entry.second));
  std::sort(ops.begin(), ops.end(), [](const OpStats& a, const OpStats& b) {
    return a.self_us != b.self_us ? a.self_us > b.self_us : a.name < b.name;
  });
  return ops;
}

nlohmann::json chrome_trace(const std::vector<OpEvent>& events) {
  const int pid = static_cast<int>(getpid());
  nlohmann::json trace_events = nlohmann::json::array();
  for (const OpEvent& event : events) {
    nlohmann::json entry = {{"name", event.name},      {"cat", "cpu_op"},
                            {"ph", "X"},               {"ts", event.start_us},
                            {"dur", event.duration_us}, {"pid", pid},
                            {"tid", event.thread}};
    if (!event.input_shapes.empty()) entry["args"] = {{"input_shapes", event.input_shapes}};
    trace_events.push_back(std::move(entry));
  }
  return {{"traceEvents", std::move(trace_events)}, {"displayTimeUnit", "ms"}};
}

// Pairs each push with its pop (the legacy profiler files a pop under the thread of its push,
// even when it ran elsewhere) and times them from the profiler's start mark.
std::vector<OpEvent> op_events(const legacy::thread_event_lists& threads) {
  const legacy::LegacyEvent* start_mark = nullptr;
  for (const auto& thread : threads) {
    for (const auto& event : thread) {
      if (event.kind() == legacy::EventKind::Mark && std::strcmp(event.name(), "__start_profile") == 0) {
        start_mark = &event;
      }
    }
  }
  TORCH_INTERNAL_ASSERT(start_mark != nullptr, "legacy profiler recorded no start mark");
  std::vector<OpEvent> events;
  for (const auto& thread : threads) {
    std::unordered_map<uint64_t, const legacy::LegacyEvent*> pushed;
    for (const auto& event : thread) {
      if (event.kind() == legacy::EventKind::PushRange) {
        pushed[event.handle()] = &event;
      } else if (event.kind() == legacy::EventKind::PopRange) {
        auto push = pushed.find(event.handle());
        if (push == pushed.end()) continue;
        const legacy::LegacyEvent& begin = *push->second;
        events.push_back(OpEvent{begin.name(), begin.threadId(), start_mark->cpuElapsedUs(begin),
                                 begin.cpuElapsedUs(event), 0.0, begin.shapes()});
        pushed.erase(push);
      }
    }
  }
  return events;
}

}  // namespace

ProfileResult::ProfileResult(std::vector<OpEvent> events, double wall_us)
    : events_(std::move(events)), wall_us_(wall_us) {
  std::vector<bool> inside_same_name = nest(events_);
  ops_ = stats_by_self_time(events_, inside_same_name);
  for (const OpStats& op : ops_) self_us_ += op.self_us;
}

// Long names (autograd nodes of C++ functions carry their whole template type) keep their
// informative tail: "...ReluMaxPoolFunction>".
static std::string table_name(const std::string& name) {
  const size_t limit = 60;
  return name.size() <= limit ? name : "..." + name.substr(name.size() - (limit - 3));
}

std::string ProfileResult::table(size_t top_n) const {
  size_t shown = std::min(top_n, ops_.size());
  size_t name_width = std::string("Name").size();
  for (size_t i = 0; i < shown; ++i) name_width = std::max(name_width, table_name(ops_[i].name).size());
  std::string out = fmt::format("{:<{}}  {:>8}  {:>11}  {:>7}  {:>11}\n", "Name", name_width,
                                "Calls", "Self ms", "Self %", "Total ms");
  for (size_t i = 0; i < shown; ++i) {
    const OpStats& op = ops_[i];
    double percent = self_us_ > 0 ? 100.0 * op.self_us / self_us_ : 0.0;
    out += fmt::format("{:<{}}  {:>8}  {:>11.3f}  {:>6.1f}%  {:>11.3f}\n", table_name(op.name), name_width,
                       op.calls, op.self_us / 1e3, percent, op.total_us / 1e3);
  }
  if (shown < ops_.size()) out += fmt::format("({} more ops)\n", ops_.size() - shown);
  out += fmt::format("Self time of all ops: {:.3f} ms in {:.3f} ms of profiling\n", self_us_ / 1e3,
                     wall_us_ / 1e3);
  return out;
}

void ProfileResult::write_chrome_trace(const std::string& path) const {
  write_file_atomically(path, chrome_trace(events_).dump());
}

nlohmann::json ProfileResult::to_json() const {
  return {{"wall_us", wall_us_}, {"self_us", self_us_}, {"ops", ops_}};
}

Profiler::Profiler(ProfilerOptions options) : started_(std::chrono::steady_clock::now()) {
  if (torch::profiler::impl::profilerEnabled()) {
    throw Error("profiler: a LibTorch profiler is already running on this thread");
  }
  legacy::enableProfilerLegacy(
      legacy::ProfilerConfig(legacy::ProfilerState::CPU, options.record_shapes()));
}

Profiler::~Profiler() {
  if (!running_) return;
  try {
    legacy::disableProfilerLegacy();
  } catch (...) {  // a destructor must not throw; the events are being discarded anyway
  }
}

ProfileResult Profiler::stop() {
  if (!running_) throw Error("profiler: stop() called twice");
  running_ = false;
  legacy::thread_event_lists threads = legacy::disableProfilerLegacy();
  std::chrono::duration<double, std::micro> wall = std::chrono::steady_clock::now() - started_;
  return ProfileResult(op_events(threads), wall.count());
}

}  // namespace afterburner::profile
