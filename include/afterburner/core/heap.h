// Keeps freed memory in the process heap for the next allocation instead of handing it back
// to the operating system.
// glibc serves every block above its mmap threshold (128 KiB at start-up, raised only as large
// blocks are freed) from a fresh mapping and unmaps it on free, and trims the heap top as it
// shrinks: each training step's activations are then page-faulted and zero-filled by the kernel
// anew. Keeping it makes `cnn` training 1.6-1.7x faster end to end (BENCHMARKS.md, "Ablation").
// Peak resident memory stays what the peak step needs.
//
// Between phases whose working sets differ (training steps, then a large evaluation batch),
// release_freed_memory() hands what the heap keeps back to the OS, so the next phase's peak does
// not stack on top of the last one's.
//
//   afterburner::keep_freed_memory();     // once, before the first training step
//   afterburner::release_freed_memory();  // before evaluating
#pragma once

namespace afterburner {

// Process-wide and permanent. Returns false where the C library offers no such setting.
bool keep_freed_memory();

// Returns the heap's free memory to the OS now (a no-op where the C library cannot).
void release_freed_memory();

}  // namespace afterburner
