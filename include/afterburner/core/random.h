// Generators of their own for the randomized methods (sketches, random features, randomized
// factorizations): seeded by the user, or by a seed drawn from torch's default generator, which is
// read but never reseeded, so torch::manual_seed still governs every draw.
//
//   at::Generator generator = afterburner::seeded_generator(options.seed().value_or(afterburner::draw_seed()));
//   torch::Tensor omega = torch::randn({n, k}, generator, torch::kDouble);
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>

namespace afterburner {

// One seed drawn from torch's default generator.
uint64_t draw_seed();

// A CPU generator for `seed`, through splitmix64's finaliser: torch's mt19937 streams for nearby
// seeds are not independent enough (over Gaussian sketches drawn with seeds 0..399, ||S x||^2 /
// ||x||^2 spread 1.6x wider than the chi-square it follows, 0.28 against 0.18 for m = 64;
// through the mix it does not).
at::Generator seeded_generator(uint64_t seed);

}  // namespace afterburner
