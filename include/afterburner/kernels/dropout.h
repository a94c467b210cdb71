// aten::dropout with its Bernoulli draws made in bulk: LibTorch's answer bit for bit, from the
// same draws of the same generator (torch.manual_seed seeds both alike, and the generator is left
// where LibTorch's dropout leaves it), in a fraction of the time. LibTorch 1.13's CPU bernoulli_
// (without MKL, as Debian builds it) draws one element at a time: a lock and two calls into the
// generator per element, several nanoseconds each.
//
//   torch::Tensor y = afterburner::kernels::dropout(x, 0.1, /*train=*/true);
//
// In training with 0 < p < 1 on a float, double or bf16 CPU tensor: noise drawn as LibTorch's
// bernoulli_(1 - p) draws it (per element, in the order of a contiguous tensor, two 32-bit
// outputs of the default CPU generator's MT19937, u = their low 53 bits / 2^53, 1 where
// u < 1 - p, else 0), then noise / (1 - p) and x * noise as aten::dropout computes them; autograd
// differentiates the product (the noise a constant). Otherwise at::dropout itself.
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

torch::Tensor dropout(const torch::Tensor& x, double p, bool train);

}  // namespace afterburner::kernels
