// Batched, vectorized transforms that the loader workers apply after the gather. Each call
// gets a seed; all randomness is drawn from it (per sample), so a batch's result does not
// depend on which thread computes it.
//
//   TransformPtr augment = compose({to_float(1.0 / 255), normalize({0.2860}, {0.3530}),
//                                   random_crop(2), random_horizontal_flip(0.5)});
//   Batch out = (*augment)(std::move(batch), /*seed=*/42);   // uint8 in, float32 out
//
// compose() runs that image chain (to_float first, then any of normalize, random_crop and
// random_horizontal_flip, each at most once, crop before flip) on uint8 [N, C, H, W] input as
// one fused pass: a per-channel 256-entry table maps each uint8 once to its final float and
// the crop offset and flip fold into the indexing. The result equals the stage-by-stage one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/data/dataset.h"

namespace afterburner::data {

class BatchTransform {
 public:
  virtual ~BatchTransform() = default;
  virtual Batch operator()(Batch batch, uint64_t seed) const = 0;
  // For logs: the transform and its parameters, e.g. "random_crop(padding=2, fill=0)".
  virtual std::string describe() const { return "custom"; }
};
using TransformPtr = std::shared_ptr<const BatchTransform>;

// input -> float32(input) * scale.
TransformPtr to_float(double scale = 1.0);

// Float input [N, C, ...]: channel c -> (x - mean[c]) * (1 / std[c]). One mean and one std
// apply to every channel.
TransformPtr normalize(std::vector<double> mean, std::vector<double> std);

// Input [N, C, H, W]: pads each side by `padding` with `fill`, then crops back to H x W at an
// offset drawn per sample uniformly from [0, 2 * padding] in each direction.
TransformPtr random_crop(int64_t padding, double fill = 0.0);

// Input [N, C, H, W]: mirrors each sample left-right with probability p.
TransformPtr random_horizontal_flip(double p = 0.5);

// Applies the transforms in order; stage k draws from a seed derived from (seed, k).
// describe() says "fused_compose(...)" when the fused image pass applies to uint8 input.
TransformPtr compose(std::vector<TransformPtr> transforms);

}  // namespace afterburner::data
