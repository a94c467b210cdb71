// verify() against hand-computed differences, and measure()'s bookkeeping.
#include <gtest/gtest.h>

#include <cmath>

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
    EXPECT_GE(point.calls, 5);
    EXPECT_LE(point.p50_ms, point.p99_ms);
    EXPECT_DOUBLE_EQ(point.samples_per_second, 1000.0 * point.batch_size / point.p50_ms);
  }
  const auto& best = speed.best();
  for (const auto& point : speed.points) EXPECT_GE(best.samples_per_second, point.samples_per_second);
}

TEST(Measure, BadBatchSizesNameTheField) {
  auto model = shifted(torch::zeros({8}));
  for (const auto& sizes : {std::vector<int64_t>{}, std::vector<int64_t>{4, 0}}) {
    auto message = error_message<UsageError>(
        [&] { infer::measure(model, {8}, infer::MeasureOptions().batch_sizes(sizes)); });
    EXPECT_TRUE(Contains(message, "batch_sizes"));
  }
  EXPECT_TRUE(Contains(error_message<Error>([] { infer::Speed().best(); }), "no batch sizes"));
}

}  // namespace
}  // namespace afterburner::testing
