// concat_reserve and concat_append against torch.cat, bit for bit (NaN and infinities included):
// a chain of appends copies only the new channels into the first buffer while it has room, every
// earlier result keeps its values, a second append to the same result or to a tensor the kernels
// did not make copies instead of writing, inputs stay as they were, and what torch.cat would
// promote or refuse gets torch.cat's answer; oneDNN tensors are read as their dense values.
#include "afterburner/kernels/channel_concat.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "non_finite.h"

namespace afterburner::kernels {
namespace {
using testing::BitwiseEqual;
using testing::sprinkle_non_finite;

torch::Tensor features(int64_t batch, int64_t channels, int64_t seed) {
  torch::manual_seed(seed);
  return sprinkle_non_finite(torch::randn({batch, channels, 5, 3}));
}

bool shares_memory(const torch::Tensor& a, const torch::Tensor& b) { return a.data_ptr() == b.data_ptr(); }

TEST(ChannelConcat, AChainOfAppendsIsTorchCatAndCopiesOnlyTheNewChannels) {
  for (const int64_t batch : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    const std::vector<torch::Tensor> pieces{features(batch, 16, 1), features(batch, 8, 2), features(batch, 8, 3),
                                            features(batch, 5, 4)};
    std::vector<torch::Tensor> before;
    for (const auto& piece : pieces) before.push_back(piece.clone());
    std::vector<torch::Tensor> results{concat_reserve({pieces[0]}, /*spare=*/21)};
    for (size_t i = 1; i < pieces.size(); ++i) {
      results.push_back(concat_append(results.back(), {pieces[i]}, /*spare=*/0));
      EXPECT_TRUE(shares_memory(results[i], results[0])) << "append " << i << " copied the features held";
    }
    for (size_t i = 0; i < results.size(); ++i) {  // after every append: earlier results unchanged
      const std::vector<torch::Tensor> prefix(pieces.begin(), pieces.begin() + static_cast<int64_t>(i) + 1);
      EXPECT_TRUE(BitwiseEqual(results[i], torch::cat(prefix, 1))) << "result " << i;
    }
    EXPECT_EQ(batch == 1, results[1].is_contiguous()) << "a slice of the buffer";
    for (size_t i = 0; i < pieces.size(); ++i) EXPECT_TRUE(BitwiseEqual(pieces[i], before[i])) << "input " << i;
    EXPECT_TRUE(BitwiseEqual(concat_reserve({pieces[0]}, 21), results[0])) << "second call";
  }
}

TEST(ChannelConcat, SeveralAppendedAtOnceAndNoRoomLeftGiveTorchCat) {
  const auto a = features(2, 4, 5), b = features(2, 3, 6), c = features(2, 6, 7);
  const auto held = concat_reserve({a, b}, /*spare=*/5);
  EXPECT_TRUE(BitwiseEqual(held, torch::cat({a, b}, 1)));
  const auto no_room = concat_append(held, {c}, /*spare=*/2);  // 6 channels, room for 5
  EXPECT_TRUE(BitwiseEqual(no_room, torch::cat({a, b, c}, 1)));
  EXPECT_FALSE(shares_memory(no_room, held));
  const auto after = concat_append(no_room, {a.narrow(1, 0, 2)}, 0);  // the new buffer's spare
  EXPECT_TRUE(shares_memory(after, no_room));
  EXPECT_TRUE(BitwiseEqual(after, torch::cat({a, b, c, a.narrow(1, 0, 2)}, 1)));
  EXPECT_TRUE(BitwiseEqual(held, torch::cat({a, b}, 1)));
}

// Only the widest result of a buffer grows in place: a second append to the same result (a
// branch) must not overwrite the first append's channels.
TEST(ChannelConcat, ASecondAppendToTheSameResultCopies) {
  const auto x = features(3, 16, 8), first = features(3, 8, 9), second = features(3, 8, 10);
  const auto held = concat_reserve({x}, 16);
  const auto one = concat_append(held, {first}, 0);
  const auto other = concat_append(held, {second}, 0);
  EXPECT_TRUE(BitwiseEqual(one, torch::cat({x, first}, 1)));
  EXPECT_TRUE(BitwiseEqual(other, torch::cat({x, second}, 1)));
  EXPECT_FALSE(shares_memory(other, held));
}

// A channel slice of the user's own tensor, laid out as the kernels lay out theirs: never written.
TEST(ChannelConcat, TensorsTheKernelsDidNotMakeAreNeverWrittenInto) {
  const auto users = features(2, 10, 11);
  const auto users_before = users.clone();
  const auto slice = users.narrow(1, 0, 4);
  const auto more = features(2, 3, 12);
  const auto out = concat_append(slice, {more}, 0);
  EXPECT_TRUE(BitwiseEqual(out, torch::cat({slice, more}, 1)));
  EXPECT_TRUE(BitwiseEqual(users, users_before));
}

TEST(ChannelConcat, WhatTorchCatPromotesOrRefusesIsTorchCats) {
  const auto x = torch::randn({2, 4, 3, 3});
  const auto doubles = torch::randn({2, 2, 3, 3}, torch::kDouble);
  EXPECT_TRUE(BitwiseEqual(concat_reserve({x, doubles}, 4), torch::cat({x, doubles}, 1)));
  EXPECT_TRUE(BitwiseEqual(concat_append(concat_reserve({x}, 4), {doubles}, 0), torch::cat({x, doubles}, 1)));
  EXPECT_THROW(concat_reserve({x, torch::randn({2, 4, 2, 3})}, 4), c10::Error);
  EXPECT_THROW(concat_append(concat_reserve({x}, 4), {torch::randn({3, 4, 3, 3})}, 0), c10::Error);
  EXPECT_TRUE(BitwiseEqual(concat_reserve({x.narrow(0, 0, 0)}, 4), torch::cat({x.narrow(0, 0, 0)}, 1)));
  const auto channels_last = x.contiguous(at::MemoryFormat::ChannelsLast);
  const auto kept = concat_append(concat_reserve({channels_last}, 4), {channels_last}, 0);
  EXPECT_TRUE(BitwiseEqual(kept, torch::cat({x, x}, 1)));
  EXPECT_TRUE(kept.is_contiguous(at::MemoryFormat::ChannelsLast)) << "torch.cat's layout";
}

// A convolution's output on oneDNN's blocked layout (20 channels: a padded last block), as an
// optimized graph appends it: reordered into the buffer, read as its dense values.
TEST(ChannelConcat, OnednnTensorsAreReadAsTheirDenseValues) {
  for (const int64_t batch : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    const auto x = features(batch, 16, 15);
    const auto weight = torch::randn({20, 16, 3, 3}) * 0.2;
    const auto y = torch::mkldnn_convolution(x.to_mkldnn(), weight.to_mkldnn(), {}, {1, 1}, {1, 1}, {1, 1}, 1);
    const auto y_dense = y.to_dense();
    const auto held = concat_reserve({x}, 20);
    const auto out = concat_append(held, {y}, 0);
    EXPECT_TRUE(shares_memory(out, held));
    EXPECT_TRUE(BitwiseEqual(out, torch::cat({x, y_dense}, 1)));
    EXPECT_TRUE(BitwiseEqual(y.to_dense(), y_dense)) << "input changed";
    EXPECT_TRUE(BitwiseEqual(concat_reserve({y, x}, 0), torch::cat({y_dense, x}, 1)));
    EXPECT_TRUE(BitwiseEqual(concat_append(x, {y}, 0), torch::cat({x, y_dense}, 1))) << "held not a buffer";
  }
}

TEST(ChannelConcat, TheDispatcherOpsAreTheKernels) {
  const auto a = features(1, 6, 13), b = features(1, 2, 14);
  static const auto reserve = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("afterburner::concat_reserve", "")
                                  .typed<at::Tensor(at::TensorList, int64_t)>();
  static const auto append = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("afterburner::concat_append", "")
                                 .typed<at::Tensor(const at::Tensor&, at::TensorList, int64_t)>();
  const auto held = reserve.call({a}, 2);
  EXPECT_TRUE(BitwiseEqual(append.call(held, {b}, 0), torch::cat({a, b}, 1)));
}

}  // namespace
}  // namespace afterburner::kernels
