#include "afterburner/profile/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <limits>
#include <mutex>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>

#include "afterburner/core/error.h"

namespace afterburner::profile {

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

double current_rss_mb() {
  std::ifstream statm("/proc/self/statm");
  int64_t total_pages = 0;
  int64_t resident_pages = 0;
  if (!(statm >> total_pages >> resident_pages)) {
    throw Error("/proc/self/statm: cannot read the resident set size");
  }
  return static_cast<double>(resident_pages) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         (1024.0 * 1024.0);
}

namespace {

// Wraps the CPU allocator LibTorch had at install(). Every DataPtr it hands out has
// context == data, so raw_allocate()/raw_deallocate() keep working (oneDNN allocates through
// them); the wrapped allocator's own context and deleter wait in a table keyed by the data.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t bytes) const override {
    c10::DataPtr inner = wrapped_->allocate(bytes);
    void* data = inner.get();
    if (data == nullptr) return inner;  // empty storage: nothing to count, no key to file it under
    Allocation allocation{inner.get_deleter(), inner.release_context(), static_cast<int64_t>(bytes)};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(data, allocation);
      current_ += allocation.bytes;
      peak_ = std::max(peak_, current_);
    }
    return c10::DataPtr(data, data, &release, inner.device());
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  int64_t current() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_;
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = current_;
  }

 private:
  struct Allocation {
    c10::DeleterFnPtr deleter;
    void* context;
    int64_t bytes;
  };

  static void release(void* data);

  void free(void* data) const {
    Allocation allocation{};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = live_.find(data);
      if (found == live_.end()) {
        free_raw_from_before_install(data);
        return;
      }
      allocation = found->second;
      live_.erase(found);
      current_ -= allocation.bytes;
    }
    if (allocation.deleter != nullptr) allocation.deleter(allocation.context);
  }

  // raw_deallocate() asks the allocator current at free time, so memory raw-allocated before
  // install() arrives here; it came from the wrapped allocator's raw interface.
  void free_raw_from_before_install(void* data) const {
    c10::DeleterFnPtr raw = wrapped_->raw_deleter();
    TORCH_INTERNAL_ASSERT(raw != nullptr, "TensorMemory: freeing memory it never allocated");
    raw(data);
  }

  c10::Allocator* wrapped_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Allocation> live_;
  mutable int64_t current_ = 0;
  mutable int64_t peak_ = 0;
};

// Never destroyed: tensors may be freed during static destruction, after any static object.
std::atomic<CountingAllocator*> counting_allocator{nullptr};

void CountingAllocator::release(void* data) { counting_allocator.load()->free(data); }

// The highest priority, so an allocator set later cannot silently stop the counting.
constexpr uint8_t kAllocatorPriority = std::numeric_limits<uint8_t>::max();

}  // namespace

void TensorMemory::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto* allocator = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(allocator, kAllocatorPriority);
    if (c10::GetCPUAllocator() != allocator) {
      delete allocator;
      throw Error("TensorMemory: LibTorch kept another CPU allocator of maximal priority");
    }
    counting_allocator = allocator;
  });
}

bool TensorMemory::installed() {
  CountingAllocator* allocator = counting_allocator.load();
  return allocator != nullptr && c10::GetCPUAllocator() == allocator;
}

int64_t TensorMemory::current_bytes() {
  CountingAllocator* allocator = counting_allocator.load();
  return allocator ? allocator->current() : 0;
}

int64_t TensorMemory::peak_bytes() {
  CountingAllocator* allocator = counting_allocator.load();
  return allocator ? allocator->peak() : 0;
}

void TensorMemory::reset_peak() {
  if (CountingAllocator* allocator = counting_allocator.load()) allocator->reset_peak();
}

}  // namespace afterburner::profile
