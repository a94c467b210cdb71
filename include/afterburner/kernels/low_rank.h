// A low-rank linear map with autograd, the two GEMMs every sketched layer runs: for x [M, K],
// a [K, R], b [R, N] with R small, y = scale (x a) b + bias, never forming the K x N product.
// fp32 runs on oneDNN's GEMM (kernels::mm), on the OpenMP pool the rest of the step uses, instead
// of OpenBLAS's own pool, which on 2 cores made a sub-millisecond call take up to 15 ms at
// random (BENCHMARKS.md, sketched layers). Under CPU autocast the operands take autocast's dtype.
// The backward is differentiable itself (create_graph).
//
// An epilogue applies ReLU and then dropout to the product in the same autograd node, what
// `F.dropout(F.relu(sklinear(x)), p, training)` computes in three: with dropout, one pass over
// the GEMM's output forward, keeping one byte per element (kept by dropout, passed by ReLU) where
// LibTorch keeps the activation and the noise (8 bytes in fp32), and one pass backward forming
// the masked gradient; ReLU alone runs in place on the GEMM's output, which it keeps for its
// gradient as at::relu does. The answers are eager LibTorch's bit for bit, gradients included (at::relu: NaN
// stays, -0 stays -0; dropout from the same draws of the default generator, kernels/dropout.h;
// the gradient threshold_backward of dy times the noise, the bias's its at::sum), NaN payloads
// aside (bf16 NaN is written 0x7fc0, as c10::BFloat16 rounds it).
//
//   namespace kernels = afterburner::kernels;
//   torch::Tensor y = kernels::low_rank_linear(x, a, b, bias, 0.5);   // bias may be undefined
//   torch::Tensor h = kernels::low_rank_linear(x, a, b, bias, 0.5,
//                                              kernels::LowRankEpilogue().relu(true).dropout(0.1).train(true));
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

namespace afterburner::kernels {

struct LowRankEpilogue {
  TORCH_ARG(bool, relu) = false;
  TORCH_ARG(double, dropout) = 0.0;  // p, applied only when train; 0 <= p <= 1
  TORCH_ARG(bool, train) = false;
};

// Throws UsageError naming the operand whose shape does not fit, or the dropout probability
// outside [0, 1].
torch::Tensor low_rank_linear(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                              const torch::Tensor& bias, double scale, const LowRankEpilogue& epilogue = {});

}  // namespace afterburner::kernels
