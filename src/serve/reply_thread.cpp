#include "reply_thread.h"

namespace afterburner::serve::detail {

ReplyThread::ReplyThread() : thread_([this] { run(); }) {}

ReplyThread::~ReplyThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  posted_.notify_one();
  thread_.join();
}

void ReplyThread::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  posted_.notify_one();
}

// Takes everything posted at once: a batch's answers arrive together, and one wake-up sends them.
void ReplyThread::run() {
  std::vector<std::function<void()>> taken;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      posted_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      taken.swap(tasks_);
    }
    for (auto& task : taken) task();
    taken.clear();
  }
}

}  // namespace afterburner::serve::detail
