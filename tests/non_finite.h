// NaN and infinities in test inputs, and how answers to them are judged: LibTorch's ops are the
// reference, so NaN must stand where they put NaN, each infinity where they put the same
// infinity, and the finite elements must be close.
//
//   torch::Tensor x = with_non_finite(torch::randn({7, 5}), generator);   // NaN, +inf, -inf planted
//   EXPECT_TRUE(AgreesWithNonFinite(op(x), reference(x), 1e-6, 1e-6));
//   EXPECT_TRUE(BitwiseEqual(op(x), op(x)));                           // torch::equal says NaN != NaN
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace afterburner::testing {

// `x` with NaN, +inf and -inf, in that order, at up to three distinct positions drawn from
// `generator` (as many as it has elements), written through x's strides (so into the tensor a
// view shows). Changes and returns `x`.
inline torch::Tensor with_non_finite(torch::Tensor x, at::Generator& generator) {
  const torch::NoGradGuard no_grad;
  const double values[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  const torch::Tensor positions = torch::randperm(x.numel(), generator, torch::kLong);
  for (int64_t i = 0; i < std::min<int64_t>(3, x.numel()); ++i) {
    torch::Tensor element = x;
    int64_t rest = positions[i].item<int64_t>();
    std::vector<int64_t> index(x.dim());
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      index[d] = rest % x.size(d);
      rest /= x.size(d);
    }
    for (const int64_t position : index) element = element.select(0, position);
    element.fill_(values[i]);
  }
  return x;
}

// Four images [4, image_sizes...] of standard normal values drawn after manual_seed(seed): a NaN
// in the first, a +inf in the second, a -inf in the third, each at flat position `position` of
// its image, and the fourth finite.
inline torch::Tensor images_with_non_finite(std::vector<int64_t> image_sizes, int64_t position, uint64_t seed = 1) {
  torch::manual_seed(seed);
  image_sizes.insert(image_sizes.begin(), 4);
  torch::Tensor images = torch::randn(image_sizes);
  const double values[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  for (int64_t i = 0; i < 3; ++i) images[i].view(-1)[position] = values[i];
  return images;
}

// `x` (contiguous) with NaN at every 7th flat position, +inf at every 11th from the 3rd and -inf
// at every 13th from the 4th: many of each, for kernels checked window by window or block by
// block. Changes and returns `x`.
inline torch::Tensor sprinkle_non_finite(torch::Tensor x) {
  const torch::NoGradGuard no_grad;
  torch::Tensor flat = x.view(-1);
  flat.slice(0, 0, flat.numel(), 7).fill_(std::numeric_limits<double>::quiet_NaN());
  flat.slice(0, 2, flat.numel(), 11).fill_(std::numeric_limits<double>::infinity());
  flat.slice(0, 3, flat.numel(), 13).fill_(-std::numeric_limits<double>::infinity());
  return x;
}

// The same dtype and shape, equal values, NaN where the other has NaN (for ops whose answers must
// be LibTorch's exactly: max pooling, the same ATen kernel on another buffer).
inline ::testing::AssertionResult Identical(const torch::Tensor& actual, const torch::Tensor& expected) {
  if (actual.sizes() == expected.sizes() && actual.scalar_type() == expected.scalar_type() &&
      torch::allclose(actual, expected, 0, 0, /*equal_nan=*/true)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "\n" << actual << "\nvs expected\n" << expected;
}

// Elementwise: both NaN, or the same infinity, or both finite and |actual - expected| <= atol +
// rtol |expected|. The message names the first element that is not, with both values.
inline ::testing::AssertionResult AgreesWithNonFinite(const torch::Tensor& actual, const torch::Tensor& expected,
                                                      double atol, double rtol) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " vs expected " << expected.sizes();
  }
  const torch::Tensor a = actual.detach().to(torch::kDouble).reshape(-1);
  const torch::Tensor e = expected.detach().to(torch::kDouble).reshape(-1);
  const torch::Tensor both_finite = a.isfinite() & e.isfinite();
  const torch::Tensor agree = (a.isnan() & e.isnan()) | (a.isinf() & (a == e)) |
                              (both_finite & ((a - e).abs() <= atol + rtol * e.abs()));
  if (agree.all().item<bool>()) return ::testing::AssertionSuccess();
  const int64_t first = agree.logical_not().nonzero()[0][0].item<int64_t>();
  return ::testing::AssertionFailure() << agree.logical_not().sum().item<int64_t>() << " of " << a.numel()
                                       << " elements disagree, the first at flat index " << first << ": "
                                       << a[first].item<double>() << " vs expected " << e[first].item<double>()
                                       << " (atol " << atol << ", rtol " << rtol << ")";
}

// The same dtype, shape and bytes (torch::equal compares values, and NaN equals nothing).
inline bool BitwiseEqual(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const torch::Tensor x = a.detach().contiguous(), y = b.detach().contiguous();
  return x.numel() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

}  // namespace afterburner::testing
