// LibTorch's dropout noise for the kernels that apply dropout inside a pass of their own
// (kernels/low_rank.h): the same draws from the default CPU generator that aten::dropout's
// bernoulli_ makes, in the order of a contiguous tensor. Internal to src/kernels.
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

// uint8 flags of `sizes`: 1 where noise.bernoulli_(keep) keeps the element (as kernels::dropout
// and aten::dropout draw it), else 0. Advances the default CPU generator as that call does.
torch::Tensor dropout_keep_flags(at::IntArrayRef sizes, double keep);

// What dropout multiplies a kept element by: 1 / keep as div_ computes it in `dtype` (one element).
torch::Tensor dropout_kept_value(at::ScalarType dtype, double keep);

}  // namespace afterburner::kernels
