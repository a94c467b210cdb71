#include "reply_thread.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace afterburner::serve::detail {
namespace {

TEST(ReplyThread, RunsTasksInTheOrderPostedOnOneThreadOfItsOwn) {
  std::vector<int> order;
  std::set<std::thread::id> threads;
  std::promise<void> done;
  {
    ReplyThread replies;
    for (int i = 0; i < 500; ++i) {
      replies.post([&, i] {
        order.push_back(i);
        threads.insert(std::this_thread::get_id());
        if (i == 499) done.set_value();
      });
    }
    done.get_future().wait();
  }
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_NE(*threads.begin(), std::this_thread::get_id());
}

// A server's answers posted just before it stops are still sent: none is dropped at the end,
// though the thread is still busy with an earlier one when it is told to stop.
TEST(ReplyThread, RunsEveryPostedTaskBeforeItEnds) {
  std::mutex mutex;
  int ran = 0;
  std::promise<void> stopping;
  {
    ReplyThread replies;
    replies.post([released = stopping.get_future().share()] {
      released.wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the destructor is waiting by now
    });
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) {
          replies.post([&] {
            std::lock_guard<std::mutex> lock(mutex);
            ++ran;
          });
        }
      });
    }
    for (auto& poster : posters) poster.join();
    stopping.set_value();
  }
  EXPECT_EQ(ran, 4000);
}

TEST(ReplyThread, AnswersOnTheAskingThreadAtOnceAndFromElsewhereOnItsThread) {
  ReplyThread replies;
  const std::thread::id here = std::this_thread::get_id();
  std::thread::id ran_on;
  replies.answer(here, [&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, here);  // already run: no wait

  std::promise<std::thread::id> later;
  std::thread batcher([&] { replies.answer(here, [&] { later.set_value(std::this_thread::get_id()); }); });
  const std::thread::id batcher_id = batcher.get_id();
  const std::thread::id answered_on = later.get_future().get();
  batcher.join();
  EXPECT_NE(answered_on, here);
  EXPECT_NE(answered_on, batcher_id);
}

}  // namespace
}  // namespace afterburner::serve::detail
