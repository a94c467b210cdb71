#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/data/dataset.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

TEST(TensorDataset, GetBatchGathersInIndexOrder) {
  auto inputs = torch::rand({6, 2, 3});
  auto targets = torch::tensor({5, 4, 3, 2, 1, 0}, torch::kInt);
  TensorDataset dataset(inputs, targets);
  ASSERT_EQ(dataset.size(), 6);
  Batch batch = dataset.get_batch(torch::tensor({4, 0, 4}, torch::kLong));
  EXPECT_TRUE(batch.input.is_contiguous());
  EXPECT_TRUE(torch::equal(batch.input, torch::stack({inputs[4], inputs[0], inputs[4]})));
  EXPECT_EQ(batch.target.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({1, 5, 1}, torch::kLong)));
}

TEST(TensorDataset, NonContiguousInputsAreGatheredCorrectly) {
  auto inputs = torch::arange(24, torch::kFloat).view({4, 6}).t();  // [6, 4], strided
  TensorDataset dataset(inputs, torch::arange(6));
  Batch batch = dataset.get_batch(torch::tensor({5, 1}, torch::kLong));
  EXPECT_TRUE(torch::equal(batch.input, torch::stack({inputs[5], inputs[1]})));
}

TEST(TensorDataset, RejectsMismatchedCounts) {
  auto message = error_message<UsageError>([] { TensorDataset(torch::zeros({3, 2}), torch::zeros({2}, torch::kLong)); });
  EXPECT_TRUE(Contains(message, "targets: 2 targets for 3 inputs"));
}

TEST(TensorDataset, RejectsFloatTargets) {
  auto message = error_message<UsageError>([] { TensorDataset(torch::zeros({2, 2}), torch::zeros({2})); });
  EXPECT_TRUE(Contains(message, "targets: expected integer class labels"));
}

TEST(TensorDataset, RejectsOutOfRangeIndices) {
  TensorDataset dataset(torch::zeros({3, 2}), torch::zeros({3}, torch::kLong));
  auto message = error_message<UsageError>([&] { dataset.get_batch(torch::tensor({0, 3}, torch::kLong)); });
  EXPECT_TRUE(Contains(message, "indices: index 3 is out of range for 3 samples"));
  message = error_message<UsageError>([&] { dataset.get_batch(torch::tensor({0, 1}, torch::kInt)); });
  EXPECT_TRUE(Contains(message, "indices: expected a 1-D int64 tensor"));
}

TEST(CheckLabels, NamesTheFirstLabelOutsideTheClasses) {
  EXPECT_NO_THROW(check_labels(torch::tensor({0, 9, 3}, torch::kByte), 10, "labels"));
  EXPECT_EQ(error_message<DataError>([] { check_labels(torch::tensor({0, 9, 10, 11}), 10, "labels"); }),
            "labels: label 10 at index 2 is outside the model's 10 classes");
  EXPECT_EQ(error_message<DataError>([] { check_labels(torch::tensor({2, -1}, torch::kChar), 3, "file.idx"); }),
            "file.idx: label -1 at index 1 is outside the model's 3 classes");
}

TEST(CheckLabels, SkippingRecordsEachLabelOutsideTheClassesAndKeepsTheOthers) {
  SkippedInputs skipped;
  const torch::Tensor kept = check_labels(torch::tensor({0, 10, 3, -1, 9}), 10, "labels", &skipped);
  EXPECT_TRUE(torch::equal(kept, torch::tensor({0, 2, 4}, torch::kLong)));
  EXPECT_EQ(skipped.lines(), (std::vector<std::string>{"labels: label 10 at index 1 is outside the model's 10 classes",
                                                       "labels: label -1 at index 3 is outside the model's 10 classes"}));
  check_labels(torch::tensor({10}), 10, "labels", &skipped);  // the same line again is recorded once
  EXPECT_EQ(skipped.lines().size(), 3u);
  check_labels(torch::tensor({0, 10}), 10, "labels", &skipped);
  EXPECT_EQ(skipped.lines().size(), 3u);
}

TEST(SkipOrThrow, RecordsDataErrorsOnlyWhenSkippingAndPassesOtherErrorsOn) {
  SkippedInputs skipped;
  const auto corrupt = [] { throw DataError("a.png", "corrupt PNG"); };
  EXPECT_FALSE(skip_or_throw(&skipped, corrupt));
  EXPECT_TRUE(skip_or_throw(&skipped, [] {}));
  EXPECT_EQ(skipped.lines(), std::vector<std::string>{"a.png: corrupt PNG"});
  EXPECT_THROW(skip_or_throw(nullptr, corrupt), DataError);
  EXPECT_THROW(skip_or_throw(&skipped, [] { throw UsageError("--data", "bad"); }), UsageError);
}

TEST(SubsetDataset, ComposesViews) {
  auto base = std::make_shared<TensorDataset>(torch::arange(10, torch::kFloat).view({10, 1}), torch::arange(10));
  auto odd = std::make_shared<SubsetDataset>(base, torch::arange(1, 10, 2));        // 1 3 5 7 9
  auto tail = std::make_shared<SubsetDataset>(odd, torch::tensor({4, 2}, torch::kLong));  // 9 5
  ASSERT_EQ(odd->size(), 5);
  ASSERT_EQ(tail->size(), 2);
  Batch batch = tail->get_batch(torch::tensor({1, 0, 1}, torch::kLong));
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({5, 9, 5}, torch::kLong)));
  EXPECT_TRUE(torch::equal(batch.input, torch::tensor({5.0f, 9.0f, 5.0f}).view({3, 1})));
}

TEST(SubsetDataset, RejectsIndicesOutsideTheBase) {
  auto base = std::make_shared<TensorDataset>(torch::zeros({4, 1}), torch::zeros({4}, torch::kLong));
  auto message = error_message<UsageError>([&] { SubsetDataset(base, torch::tensor({1, 4}, torch::kLong)); });
  EXPECT_TRUE(Contains(message, "index 4 is out of range for 4 samples"));
}

}  // namespace
}  // namespace afterburner::data
