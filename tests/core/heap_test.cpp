#include "afterburner/core/heap.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace {

constexpr size_t kBlock = 8u << 20;  // an activation-sized block, far above glibc's initial mmap threshold

// Writes every page so the block is resident, as a tensor's would be. The writes are volatile:
// the compiler would otherwise drop them, and the allocation, as nothing reads the block.
void* touched_block() {
  auto* block = static_cast<volatile char*>(std::malloc(kBlock));
  for (size_t offset = 0; offset < kBlock; offset += 4096) block[offset] = 1;
  return const_cast<char*>(block);
}

TEST(Heap, KeptMemoryIsServedFromTheHeapAndStaysThereWhenFreed) {
  ASSERT_TRUE(afterburner::keep_freed_memory());
  const struct mallinfo2 before = mallinfo2();
  void* block = touched_block();
  EXPECT_EQ(mallinfo2().hblkhd, before.hblkhd) << "the block got its own mapping";
  std::free(block);
  EXPECT_GE(mallinfo2().fordblks, kBlock) << "the freed block left the heap";
}

// Resident bytes of this process, from /proc/self/statm.
size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t total_pages = 0, resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// A freed block below one still in use, as training leaves the heap: its pages go back.
TEST(Heap, ReleaseHandsTheKeptMemoryBack) {
  ASSERT_TRUE(afterburner::keep_freed_memory());
  void* lower = touched_block();
  void* upper = touched_block();
  std::free(lower);
  const size_t kept = resident_bytes();
  afterburner::release_freed_memory();
  EXPECT_LE(resident_bytes() + kBlock / 2, kept);
  std::free(upper);
}

}  // namespace
