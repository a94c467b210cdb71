// What this CPU computes natively, for choices that depend on it (bf16 as the default precision,
// the fused attention's bf16 path).
//
//   if (afterburner::cpu_has_native_bf16()) precision = Precision::bf16;
#pragma once

namespace afterburner {

// Whether this CPU computes bf16 natively (AVX512-BF16 or AMX, from /proc/cpuinfo); without it
// LibTorch and oneDNN emulate bf16, slower than fp32. Read once.
bool cpu_has_native_bf16();

}  // namespace afterburner
