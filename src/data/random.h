// Deterministic randomness for the data pipeline, independent of torch's global generator
// and of which thread asks: every draw is a pure function of a 64-bit seed.
#pragma once

#include <cstdint>

namespace afterburner::data {

// splitmix64's finalizer: a bijection of 64-bit words with full avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The seed of stream `child` under `parent`: distinct children give unrelated seeds.
inline uint64_t derive_seed(uint64_t parent, uint64_t child) { return mix64(parent ^ mix64(child)); }

// Uniform integer in [0, bound) from 64 random bits (Lemire's multiply-shift; the bias,
// bound / 2^64, is negligible for dataset sizes).
inline uint64_t bounded(uint64_t bits, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * bound) >> 64);
}

// Uniform double in [0, 1) from the top 53 bits.
inline double unit_interval(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace afterburner::data
