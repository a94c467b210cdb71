#include "afterburner/core/heap.h"

#include <climits>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace afterburner {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit: blocks above it (the dataset,
  // huge batches) still get their own mappings.
  constexpr int kLargestMmapThreshold = 32 * 1024 * 1024;
  return mallopt(M_MMAP_THRESHOLD, kLargestMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
#else
  return false;
#endif
}

void release_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace afterburner
