// Memory of the process and of LibTorch's CPU tensors.
//
//   profile::TensorMemory::install();        // once, before the tensors you want counted
//   profile::TensorMemory::reset_peak();
//   train_one_epoch();
//   fmt::print("tensors: peak {} MiB, process: peak {:.0f} MiB\n",
//              profile::TensorMemory::peak_bytes() >> 20, profile::peak_rss_mb());
#pragma once

#include <cstdint>

namespace afterburner::profile {

// Highest resident set size of this process so far, in MiB (getrusage's ru_maxrss).
double peak_rss_mb();
// Resident set size of this process now, in MiB (/proc/self/statm).
double current_rss_mb();

// Counts the bytes of CPU tensor storage by wrapping LibTorch's CPU allocator.
// Process-wide and lock-protected: tensors allocated on any thread count. Storage allocated
// before install() is neither counted nor disturbed: it still frees through its own deleter.
class TensorMemory {
 public:
  // Installs the counting allocator; later calls do nothing. Call it early, before other
  // threads allocate tensors: LibTorch swaps its allocator pointer without synchronisation.
  // Throws afterburner::Error when LibTorch keeps another allocator of maximal priority.
  static void install();
  static bool installed();
  // Bytes held now by storage allocated since install(); 0 before.
  static int64_t current_bytes();
  // Highest current_bytes() since install() or the last reset_peak().
  static int64_t peak_bytes();
  // Restarts the peak from current_bytes(), e.g. to measure one phase of a run.
  static void reset_peak();
};

}  // namespace afterburner::profile
