#include "afterburner/core/heap.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace {

constexpr size_t kBlock = 8u << 20;  // an activation-sized block, far above glibc's initial mmap threshold

// Writes every page so the block is resident, as a tensor's would be.
void* touched_block() {
  void* block = std::malloc(kBlock);
  std::memset(block, 1, kBlock);
  return block;
}

TEST(Heap, KeptMemoryIsServedFromTheHeapAndStaysThereWhenFreed) {
  ASSERT_TRUE(afterburner::keep_freed_memory());
  const struct mallinfo2 before = mallinfo2();
  void* block = touched_block();
  EXPECT_EQ(mallinfo2().hblkhd, before.hblkhd) << "the block got its own mapping";
  std::free(block);
  EXPECT_GE(mallinfo2().fordblks, kBlock) << "the freed block left the heap";
}

TEST(Heap, ReleaseHandsTheKeptMemoryBack) {
  ASSERT_TRUE(afterburner::keep_freed_memory());
  std::free(touched_block());
  const size_t kept = mallinfo2().arena;
  afterburner::release_freed_memory();
  EXPECT_LE(mallinfo2().arena + kBlock / 2, kept);
}

}  // namespace
