// verify() against hand-computed differences, and measure()'s bookkeeping: its calls against
// its time budget.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <utility>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/infer/measure.h"
#include "afterburner/infer/verify.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

// forward(x) = x + offset: the difference between two such models is known exactly.
torch::jit::Module shifted(const torch::Tensor& offset) {
  torch::jit::Module model("__torch__.Shifted");
  model.register_buffer("offset", offset);
  model.define("def forward(self, x):\n    return x + self.offset\n");
  return model;
}

TEST(Verify, MeasuresMaxDifferenceAndTop1Agreement) {
  // Rows 0-3 have argmax 2; shifting column 0 by 5 flips rows 0 and 1 only.
  auto inputs = torch::tensor({{4.0f, 0.0f, 8.0f}, {1.0f, 0.0f, 3.0f}, {-9.0f, 0.0f, 1.0f}, {-6.0f, 2.0f, 3.0f}});
  auto original = shifted(torch::zeros({3}));
  auto optimized = shifted(torch::tensor({5.0f, 0.0f, 0.0f}));
  auto agreement = infer::verify(original, optimized, inputs, /*batch_size=*/3);  // two chunks
  EXPECT_DOUBLE_EQ(agreement.max_abs_diff, 5.0);
  EXPECT_DOUBLE_EQ(agreement.top1_agreement, 0.5);
  EXPECT_EQ(agreement.samples, 4);
  EXPECT_FALSE(infer::within(agreement, infer::Tolerance().max_abs_diff(10).min_top1_agreement(0.6)));
  EXPECT_FALSE(infer::within(agreement, infer::Tolerance().max_abs_diff(4).min_top1_agreement(0.5)));
  EXPECT_TRUE(infer::within(agreement, infer::Tolerance().max_abs_diff(5).min_top1_agreement(0.5)));
  EXPECT_TRUE(Contains(infer::describe(agreement), "top-1 agreement 50.00% (4 samples)"));
}

// Outputs in the thousands: a difference is judged against their scale, the original's largest
// magnitude (here 4000), as a relative tolerance asks.
TEST(Verify, ARelativeToleranceScalesWithTheOutputs) {
  auto inputs = torch::tensor({{4000.0f, -10.0f}, {-3000.0f, 20.0f}});
  auto original = shifted(torch::zeros({2}));
  auto optimized = shifted(torch::tensor({0.02f, 0.0f}));
  auto agreement = infer::verify(original, optimized, inputs);
  EXPECT_DOUBLE_EQ(agreement.max_abs_expected, 4000.0);
  EXPECT_FALSE(infer::within(agreement, infer::Tolerance().max_abs_diff(1e-3)));
  EXPECT_TRUE(infer::within(agreement, infer::Tolerance().max_abs_diff(1e-3).relative(5e-6)));   // 0.001 + 0.02
  EXPECT_FALSE(infer::within(agreement, infer::Tolerance().max_abs_diff(1e-3).relative(4e-6)));  // 0.001 + 0.016
  EXPECT_TRUE(Contains(infer::describe(agreement), "max abs diff 0.02 (5e-06 of their scale 4e+03)")) << infer::describe(agreement);
  EXPECT_EQ(infer::describe(infer::Tolerance().max_abs_diff(1e-3).relative(1e-4)),
            "max abs diff 0.001 + 0.0001 of the outputs' scale, top-1 agreement 99.90%");
}

TEST(Verify, NanOutputIsAnInfiniteDifference) {
  auto original = shifted(torch::zeros({2}));
  auto broken = shifted(torch::tensor({NAN, 0.0f}));
  auto agreement = infer::verify(original, broken, torch::ones({3, 2}));
  EXPECT_TRUE(std::isinf(agreement.max_abs_diff));
  EXPECT_FALSE(infer::within(agreement, infer::Tolerance().max_abs_diff(1e30).min_top1_agreement(0)));
}

TEST(Verify, DifferentOutputShapesAreAnError) {
  auto original = shifted(torch::zeros({2}));
  auto wider = shifted(torch::zeros({2, 1, 2}));
  auto message = error_message<Error>([&] { infer::verify(original, wider, torch::ones({3, 2})); });
  EXPECT_TRUE(Contains(message, "output shapes differ"));
}

TEST(Measure, ReportsEachBatchSizeAndTheBest) {
  auto model = shifted(torch::zeros({8}));
  auto speed = infer::measure(model, {8}, infer::MeasureOptions().batch_sizes({1, 4}).seconds_per_batch_size(0.01));
  ASSERT_EQ(speed.points.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& point = speed.points[i];
    EXPECT_EQ(point.batch_size, i == 0 ? 1 : 4);
    EXPECT_GE(point.calls, 1);
    EXPECT_LE(point.p50_ms, point.p99_ms);
    EXPECT_DOUBLE_EQ(point.samples_per_second, 1000.0 * point.batch_size / point.p50_ms);
  }
  const auto& best = speed.best();
  for (const auto& point : speed.points) EXPECT_GE(best.samples_per_second, point.samples_per_second);
}

// forward(x) = x + 1, counting its calls in an attribute: what measure() reports against what ran.
torch::jit::Module counting_calls() {
  torch::jit::Module model("__torch__.CountingCalls");
  model.register_attribute("calls", c10::IntType::get(), int64_t{0});
  model.define("def forward(self, x):\n    self.calls += 1\n    return x + 1\n");
  return model;
}

int64_t calls_made(const torch::jit::Module& model) { return model.attr("calls").toInt(); }

// A budget smaller than one call (a large model's batch of 256 takes seconds): one untimed call
// and one timed, whatever warmup_calls asks.
TEST(Measure, ABudgetShorterThanACallTakesOneWarmUpAndOneTimedCall) {
  auto model = counting_calls();
  auto options = infer::MeasureOptions().batch_sizes({1, 4, 16}).warmup_calls(3).seconds_per_batch_size(1e-9);
  auto speed = infer::measure(model, {8}, options);
  ASSERT_EQ(speed.points.size(), 3u);
  for (const auto& point : speed.points) {
    EXPECT_EQ(point.warmup_calls, 1) << point.batch_size;
    EXPECT_EQ(point.calls, 1) << point.batch_size;
    EXPECT_TRUE(Contains(infer::describe(point), "(1 call timed)")) << infer::describe(point);
  }
  EXPECT_EQ(calls_made(model), 6);
}

// A cheap call within a budget: every warm-up call asked for, then timed calls until it is spent.
TEST(Measure, CheapCallsWarmUpFullyAndEveryCallIsCounted) {
  auto model = counting_calls();
  auto speed = infer::measure(model, {8}, infer::MeasureOptions().batch_sizes({2}).warmup_calls(3).seconds_per_batch_size(0.2));
  const auto& point = speed.points.at(0);
  EXPECT_EQ(point.warmup_calls, 3);
  EXPECT_GE(point.calls, 1);
  EXPECT_EQ(calls_made(model), point.warmup_calls + point.calls);
  EXPECT_GE(point.seconds, 0.2);
  EXPECT_TRUE(Contains(infer::describe(point), fmt::format("({} calls timed)", point.calls)));
}

TEST(Measure, NoWarmUpWhenNoneIsAskedFor) {
  auto model = counting_calls();
  auto speed = infer::measure(model, {8}, infer::MeasureOptions().batch_sizes({2}).warmup_calls(0).seconds_per_batch_size(0));
  EXPECT_EQ(speed.points.at(0).warmup_calls, 0);
  EXPECT_EQ(calls_made(model), 1);
}

// Each point is passed on as soon as it is measured: before the next batch size's first call.
TEST(Measure, EachBatchSizeIsReportedAsItIsMeasured) {
  auto model = counting_calls();
  std::vector<std::pair<int64_t, int64_t>> reported;  // batch size, calls made by then
  auto options = infer::MeasureOptions().batch_sizes({3, 1}).seconds_per_batch_size(0.001).on_measured(
      [&](const infer::SpeedPoint& point) { reported.emplace_back(point.batch_size, calls_made(model)); });
  auto speed = infer::measure(model, {8}, options);
  ASSERT_EQ(reported.size(), 2u);
  EXPECT_EQ(reported[0].first, 3);
  EXPECT_EQ(reported[0].second, speed.points[0].warmup_calls + speed.points[0].calls);
  EXPECT_EQ(reported[1].first, 1);
  EXPECT_EQ(reported[1].second, calls_made(model));
}

TEST(Measure, BadBatchSizesNameTheField) {
  auto model = shifted(torch::zeros({8}));
  for (const auto& sizes : {std::vector<int64_t>{}, std::vector<int64_t>{4, 0}}) {
    auto message = error_message<UsageError>(
        [&] { infer::measure(model, {8}, infer::MeasureOptions().batch_sizes(sizes)); });
    EXPECT_TRUE(Contains(message, "batch_sizes"));
    EXPECT_TRUE(Contains(error_message<UsageError>([&] {
                           infer::check_measure_options(infer::MeasureOptions().batch_sizes(sizes));
                         }),
                         "batch_sizes"));
  }
  EXPECT_TRUE(Contains(error_message<Error>([] { infer::Speed().best(); }), "no batch sizes"));
}

}  // namespace
}  // namespace afterburner::testing
