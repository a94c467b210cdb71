#include "afterburner/serve/batcher.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <future>
#include <set>
#include <thread>

#include "afterburner/core/error.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Contains;

constexpr int64_t kHour = 3'600'000'000;  // microseconds: a delay no test waits for

// A real TorchScript module: y = x W^T + 1, x of 3 features, y of 4.
struct AffineModel {
  at::Tensor weight = torch::randn({4, 3});
  torch::jit::Module module{"Affine"};

  AffineModel() {
    module.register_parameter("weight", weight, /*is_buffer=*/false);
    module.define("def forward(self, x):\n    return torch.matmul(x, self.weight.t()) + 1.0\n");
  }

  Runner runner() {
    return [module = module](const std::vector<at::Tensor>& inputs) mutable {
      return std::vector<at::Tensor>{module.forward({inputs.at(0)}).toTensor()};
    };
  }

  at::Tensor reference(const at::Tensor& x) const { return x.matmul(weight.t()) + 1.0; }
};

ModelConfig affine_config() {
  ModelConfig config;
  config.name = "affine";
  config.model_file = "affine.pt";
  config.max_batch_size = 8;
  config.max_queue_delay_us = kHour;
  config.timeout_us = 2 * kHour;
  config.inputs = {{"x", DataType::FP32, {3}}};
  config.outputs = {{"y", DataType::FP32, {4}}};
  return config;
}

// Submits one request and hands back its result as a future.
std::future<BatchResult> submit(Batcher& batcher, const at::Tensor& x) {
  auto promise = std::make_shared<std::promise<BatchResult>>();
  auto future = promise->get_future();
  batcher.submit({x}, [promise](BatchResult result) { promise->set_value(std::move(result)); });
  return future;
}

// Fails instead of hanging when a batch that should run at once waits for its delay.
BatchResult wait(std::future<BatchResult>& future) {
  if (future.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "no result: the batch did not run";
    return {};
  }
  return future.get();
}

TEST(Batcher, ConcurrentRequestsGiveTheOneAtATimeResultsInBatches) {
  AffineModel model;
  ModelMetrics metrics;
  ModelConfig config = affine_config();
  config.max_queue_size = 48;  // all of them may queue
  Batcher batcher(config, {model.runner()}, metrics);
  // 4 threads x 12 requests of 1, 2 or 3 samples, 96 samples. The delay never passes, so a
  // batch runs only once the next request does not fit: every batch but the last of the
  // shutdown holds at least 6 samples.
  const std::vector<int64_t> sizes = {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3};
  std::vector<std::vector<std::pair<at::Tensor, std::future<BatchResult>>>> per_thread(4);
  std::vector<std::thread> threads;
  for (auto& requests : per_thread) {
    threads.emplace_back([&] {
      for (int64_t samples : sizes) {
        at::Tensor x = torch::randn({samples, 3});
        requests.emplace_back(x, submit(batcher, x));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  batcher.shutdown();
  for (auto& requests : per_thread) {
    for (auto& [x, future] : requests) {
      BatchResult result = wait(future);
      ASSERT_EQ(result.status, 200) << result.error;
      ASSERT_EQ(result.outputs.size(), 1u);
      EXPECT_TRUE(torch::allclose(result.outputs[0], model.reference(x), 1e-5, 1e-5));
    }
  }
  EXPECT_GE(metrics.execution_count, 96u / 8);
  EXPECT_LE(metrics.execution_count, 1 + 96u / 6);
  EXPECT_EQ(metrics.inference_count, 96u);
  EXPECT_EQ(metrics.pending_requests, 0);
}

TEST(Batcher, APreferredSizeRunsWithoutWaitingForTheDelay) {
  AffineModel model;
  ModelMetrics metrics;
  ModelConfig config = affine_config();
  config.preferred_batch_sizes = {4};
  Batcher batcher(config, {model.runner()}, metrics);
  batcher.wait_until_ready();
  std::vector<std::future<BatchResult>> futures;
  for (int i = 0; i < 5; ++i) futures.push_back(submit(batcher, torch::randn({1, 3})));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(wait(futures[i]).status, 200);
  // The fifth makes no preferred size and waits for its delay: it is still queued.
  EXPECT_EQ(metrics.execution_count, 1u);
  EXPECT_EQ(metrics.pending_requests, 1);
  batcher.shutdown();
  EXPECT_EQ(wait(futures[4]).status, 200);
  EXPECT_EQ(metrics.execution_count, 2u);
}

TEST(Batcher, ShutdownRunsTheQueuedRequests) {
  AffineModel model;
  ModelMetrics metrics;
  Batcher batcher(affine_config(), {model.runner()}, metrics);
  batcher.wait_until_ready();
  std::vector<at::Tensor> inputs;
  std::vector<std::future<BatchResult>> futures;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(torch::randn({1, 3}));
    futures.push_back(submit(batcher, inputs.back()));
  }
  EXPECT_EQ(metrics.execution_count, 0u);  // 3 of 8 samples, the delay an hour away
  EXPECT_EQ(metrics.pending_requests, 3);
  batcher.shutdown();
  for (int i = 0; i < 3; ++i) {
    BatchResult result = wait(futures[i]);
    ASSERT_EQ(result.status, 200);
    EXPECT_TRUE(torch::allclose(result.outputs[0], model.reference(inputs[i]), 1e-5, 1e-5));
  }
  EXPECT_EQ(metrics.execution_count, 1u);
  auto late_future = submit(batcher, torch::randn({1, 3}));
  BatchResult late = wait(late_future);
  EXPECT_EQ(late.status, 503);
  EXPECT_TRUE(Contains(late.error, "model 'affine' is shutting down"));
}

TEST(Batcher, AFullQueueRefusesAtOnce) {
  AffineModel model;
  ModelMetrics metrics;
  ModelConfig config = affine_config();
  config.max_queue_size = 2;
  Batcher batcher(config, {model.runner()}, metrics);
  EXPECT_EQ(batcher.refusal(), std::nullopt);
  auto first = submit(batcher, torch::randn({1, 3}));
  auto second = submit(batcher, torch::randn({1, 3}));
  // What submit would answer, asked before a request is parsed (ModelService::infer).
  EXPECT_EQ(batcher.refusal(), "model 'affine': queue full (2 requests)");
  auto refused = submit(batcher, torch::randn({1, 3}));
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(0)), std::future_status::ready);  // answered inside submit
  BatchResult result = refused.get();
  EXPECT_EQ(result.status, 503);
  EXPECT_EQ(result.error, "model 'affine': queue full (2 requests)");
  batcher.shutdown();
  EXPECT_EQ(wait(first).status, 200);
  EXPECT_EQ(wait(second).status, 200);
  EXPECT_EQ(batcher.refusal(), "model 'affine' is shutting down");
}

TEST(Batcher, BatchesAboveTheMaximumAreRefused) {
  AffineModel model;
  ModelMetrics metrics;
  Batcher batcher(affine_config(), {model.runner()}, metrics);
  auto refused = submit(batcher, torch::randn({9, 3}));
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  BatchResult result = refused.get();
  EXPECT_EQ(result.status, 400);
  EXPECT_TRUE(Contains(result.error, "batch of 9 samples, it takes 1 to 8 (max_batch_size)"));
}

TEST(Batcher, ARequestPastItsTimeoutFailsWithoutRunning) {
  AffineModel model;
  ModelMetrics metrics;
  ModelConfig config = affine_config();
  config.timeout_us = 1000;
  Batcher batcher(config, {model.runner()}, metrics);
  batcher.wait_until_ready();
  auto future = submit(batcher, torch::randn({1, 3}));
  BatchResult result = wait(future);
  EXPECT_EQ(result.status, 504);
  EXPECT_TRUE(Contains(result.error, "model 'affine': timed out after"));
  EXPECT_EQ(metrics.execution_count, 0u);
  EXPECT_EQ(metrics.pending_requests, 0);
}

TEST(Batcher, WithoutDynamicBatchingEachRequestRunsAlone) {
  AffineModel model;
  ModelMetrics metrics;
  ModelConfig config = affine_config();
  config.dynamic_batching = false;
  config.instances = 2;
  Batcher batcher(config, {model.runner(), model.runner()}, metrics);
  std::vector<std::pair<at::Tensor, std::future<BatchResult>>> requests;
  for (int64_t samples : {1, 2, 3, 1, 2, 3}) {
    at::Tensor x = torch::randn({samples, 3});
    requests.emplace_back(x, submit(batcher, x));
  }
  for (auto& [x, future] : requests) {
    BatchResult result = wait(future);
    ASSERT_EQ(result.status, 200);
    EXPECT_TRUE(torch::allclose(result.outputs[0], model.reference(x), 1e-5, 1e-5));
  }
  EXPECT_EQ(metrics.execution_count, 6u);
  EXPECT_EQ(metrics.inference_count, 12u);
}

TEST(Batcher, WarmsUpEveryBatchSizeOfEveryInstanceBeforeReady) {
  AffineModel model;
  ModelMetrics metrics;
  std::mutex mutex;
  std::vector<std::multiset<int64_t>> seen(2);
  std::vector<Runner> runners;
  for (std::size_t i = 0; i < 2; ++i) {
    runners.push_back([&, i, run = model.runner()](const std::vector<at::Tensor>& inputs) {
      std::lock_guard<std::mutex> lock(mutex);
      seen[i].insert(inputs[0].size(0));
      return run(inputs);
    });
  }
  Batcher batcher(affine_config(), runners, metrics);
  batcher.wait_until_ready();
  EXPECT_TRUE(batcher.ready());
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& sizes : seen) EXPECT_EQ(sizes, (std::multiset<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(metrics.execution_count, 0u);  // warm-up is not serving
}

TEST(Batcher, BatchersSharingAWarmUpLockWarmUpOneAtATime) {
  AffineModel model;
  std::atomic<int> warming{0};
  std::atomic<int> most_at_once{0};
  // Each call lasts 5 ms: 2 batchers x 2 instances x 8 batch sizes would overlap unless held apart.
  auto runner = [&, run = model.runner()](const std::vector<at::Tensor>& inputs) {
    const int now = ++warming;
    int most = most_at_once.load();
    while (now > most && !most_at_once.compare_exchange_weak(most, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    --warming;
    return run(inputs);
  };
  std::mutex warm_up_lock;
  ModelMetrics first_metrics, second_metrics;
  Batcher first(affine_config(), {runner, runner}, first_metrics, &warm_up_lock);
  Batcher second(affine_config(), {runner, runner}, second_metrics, &warm_up_lock);
  first.wait_until_ready();
  second.wait_until_ready();
  EXPECT_EQ(most_at_once.load(), 1);
}

TEST(Batcher, AWarmUpThatFindsWrongOutputsNamesTheModelFile) {
  AffineModel model;
  ModelMetrics metrics;
  ModelConfig config = affine_config();
  config.outputs[0].dims = {5};
  Batcher batcher(config, {model.runner()}, metrics);
  std::string message = afterburner::testing::error_message<Error>([&] { batcher.wait_until_ready(); });
  EXPECT_TRUE(Contains(message, "model 'affine': warm-up failed: affine.pt: output 'y' is Float of shape [1, 4]"));
  EXPECT_FALSE(batcher.ready());
}

TEST(Batcher, AModelErrorFailsTheBatchWith500) {
  AffineModel model;
  ModelMetrics metrics;
  ModelConfig config = affine_config();
  config.max_queue_delay_us = 0;
  Batcher batcher(config, {model.runner()}, metrics);
  auto failing = submit(batcher, torch::randn({1, 5}));  // the batcher leaves shapes to the protocol
  BatchResult result = wait(failing);
  EXPECT_EQ(result.status, 500);
  EXPECT_TRUE(Contains(result.error, "model 'affine': "));
  EXPECT_TRUE(Contains(result.error, "cannot be multiplied"));
  auto fine = submit(batcher, torch::ones({1, 3}));
  EXPECT_EQ(wait(fine).status, 200);
}

}  // namespace
}  // namespace afterburner::serve
