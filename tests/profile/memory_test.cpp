#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Context.h>
#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "afterburner/profile/memory.h"

namespace afterburner::profile {
namespace {

constexpr int64_t kMiB = 1 << 20;

torch::Tensor bytes_tensor(int64_t bytes) { return torch::empty({bytes}, torch::kByte); }

TEST(Rss, PeakGrowsAfterTouchingABigBuffer) {
  const double buffer_mb = 256;
  double current_before = current_rss_mb();
  std::vector<char> buffer(static_cast<size_t>(buffer_mb * kMiB), 1);  // every page written
  double current_with_buffer = current_rss_mb();
  double peak = peak_rss_mb();
  EXPECT_EQ(buffer[buffer.size() / 2], 1);
  // Some margin: unrelated pages may go back to the system meanwhile, and the kernel updates
  // the high-water mark from lazily synced per-thread counters.
  EXPECT_GE(current_with_buffer, current_before + 0.9 * buffer_mb);
  EXPECT_GE(peak, current_before + 0.9 * buffer_mb);
}

TEST(TensorMemory, CountsABigTensorWhileItLives) {
  TensorMemory::install();
  ASSERT_TRUE(TensorMemory::installed());
  TensorMemory::reset_peak();
  int64_t before = TensorMemory::current_bytes();
  {
    torch::Tensor big = bytes_tensor(64 * kMiB);
    EXPECT_GE(TensorMemory::current_bytes() - before, 64 * kMiB);
  }
  EXPECT_EQ(TensorMemory::current_bytes(), before);
  EXPECT_GE(TensorMemory::peak_bytes() - before, 64 * kMiB);
  TensorMemory::reset_peak();
  EXPECT_EQ(TensorMemory::peak_bytes(), before);
}

// A second install() wrapping the first would count every byte twice.
TEST(TensorMemory, InstallingTwiceCountsOnce) {
  TensorMemory::install();
  TensorMemory::install();
  int64_t before = TensorMemory::current_bytes();
  torch::Tensor tensor = bytes_tensor(kMiB);
  EXPECT_EQ(TensorMemory::current_bytes() - before, kMiB);
}

// oneDNN allocates through raw_allocate()/raw_deallocate() of the current CPU allocator.
TEST(TensorMemory, RawInterfaceAndOneDnnTensorsAreCounted) {
  TensorMemory::install();
  int64_t before = TensorMemory::current_bytes();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* raw = allocator->raw_allocate(kMiB);
  EXPECT_EQ(TensorMemory::current_bytes() - before, kMiB);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(TensorMemory::current_bytes(), before);

  if (!at::hasMKLDNN()) GTEST_SKIP() << "LibTorch built without oneDNN";
  torch::Tensor dense = torch::randn({4, 3, 32, 32});
  int64_t with_dense = TensorMemory::current_bytes();
  {
    torch::Tensor blocked = dense.to_mkldnn();
    EXPECT_GE(TensorMemory::current_bytes() - with_dense, dense.nbytes());
    EXPECT_TRUE(torch::equal(blocked.to_dense(), dense));
  }
  EXPECT_EQ(TensorMemory::current_bytes(), with_dense);
}

TEST(TensorMemory, ConcurrentAllocationsBalance) {
  TensorMemory::install();
  int64_t before = TensorMemory::current_bytes();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 1; i <= 500; ++i) bytes_tensor(64 * ((i * (t + 3)) % 97 + 1));
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(TensorMemory::current_bytes(), before);
}

// Storage allocated before install() keeps the original deleter; raw memory from before is
// freed through the counting allocator's raw_deallocate(), which must hand it back. Runs in a
// fresh process (the threadsafe death-test style re-executes the binary) so install() has
// not happened yet whatever other tests ran.
int free_allocations_from_before_install() {
  if (TensorMemory::installed() || TensorMemory::current_bytes() != 0) return 2;
  torch::Tensor tensor = torch::ones({kMiB});
  void* raw = c10::GetCPUAllocator()->raw_allocate(kMiB);
  TensorMemory::install();
  torch::Tensor counted = bytes_tensor(kMiB);
  int64_t before = TensorMemory::current_bytes();
  tensor.reset();
  c10::GetCPUAllocator()->raw_deallocate(raw);
  int64_t after = TensorMemory::current_bytes();
  std::fprintf(stderr, "counted before %lld after %lld\n", static_cast<long long>(before),
               static_cast<long long>(after));
  return before == kMiB && after == kMiB ? 0 : 1;
}

TEST(TensorMemoryDeathTest, AllocationsFromBeforeInstallFreeCleanly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(free_allocations_from_before_install()), ::testing::ExitedWithCode(0),
              "counted before 1048576 after 1048576");
}

}  // namespace
}  // namespace afterburner::profile
