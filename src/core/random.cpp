#include "afterburner/core/random.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <limits>

namespace afterburner {
namespace {

uint64_t mix_seed(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t draw_seed() {
  return static_cast<uint64_t>(torch::randint(0, std::numeric_limits<int64_t>::max(), {1}, torch::kLong).item<int64_t>());
}

at::Generator seeded_generator(uint64_t seed) { return at::detail::createCPUGenerator(mix_seed(seed)); }

}  // namespace afterburner
