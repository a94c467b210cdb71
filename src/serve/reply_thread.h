// Internal to the serve area: the thread the gRPC server answers on, so that a model's batcher
// thread hands each answer over and goes back to computing instead of writing it to the socket.
//
//   ReplyThread replies;
//   callback = [&, asker = std::this_thread::get_id()](TensorReply reply) {
//     replies.answer(asker, [reply] { send(reply); });
//   };
//
// A gRPC Finish runs gRPC's HTTP/2 framing and its send in the calling thread: 6-7% of the
// batcher's samples at 64 streams of single-sample requests, and the next requests came later.
// On this thread the answers of a batch go out while the next batch computes, in the order they
// were posted: 1.12x the requests per second (BENCHMARKS.md, stop 54). The HTTP server sends from
// the batcher's thread: its answer is one send, and with a thread more to schedule on 2 cores its
// accepted p99 under twice the load it can take was 3-5 times as long (measured there too).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace afterburner::serve::detail {

class ReplyThread {
 public:
  ReplyThread();
  // Runs what is still posted, then joins.
  ~ReplyThread();
  ReplyThread(const ReplyThread&) = delete;
  ReplyThread& operator=(const ReplyThread&) = delete;

  // Runs `task` on the thread after every task posted before it; a task must not throw.
  void post(std::function<void()> task);

  // Runs `task` here when called on `asker`, the thread that made the request: an answer given
  // before the request reached a batcher (a full queue's 503, a bad request) goes out at once,
  // as a handover per refusal would cost an overloaded server more than the refusal itself.
  template <typename Task>
  void answer(std::thread::id asker, Task&& task) {
    if (std::this_thread::get_id() == asker) return task();
    post(std::forward<Task>(task));
  }

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable posted_;
  std::vector<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace afterburner::serve::detail
