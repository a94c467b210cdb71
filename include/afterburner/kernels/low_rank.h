// A low-rank linear map with autograd, the two GEMMs every sketched layer runs: for x [M, K],
// a [K, R], b [R, N] with R small, y = scale (x a) b + bias, never forming the K x N product.
// fp32 runs on oneDNN's GEMM (kernels::mm), on the OpenMP pool the rest of the step uses, instead
// of OpenBLAS's own pool, which on 2 cores made a sub-millisecond call take up to 15 ms at
// random (BENCHMARKS.md, sketched layers). Under CPU autocast the operands take autocast's dtype.
// The backward is differentiable itself (create_graph).
//
//   namespace kernels = afterburner::kernels;
//   torch::Tensor y = kernels::low_rank_linear(x, a, b, bias, 0.5);   // bias may be undefined
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

// Throws UsageError naming the operand whose shape does not fit.
torch::Tensor low_rank_linear(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                              const torch::Tensor& bias, double scale);

}  // namespace afterburner::kernels
