// Matrix products for the fused layers' forward and backward, in fp32 on oneDNN's GEMM.
// LibTorch sends fp32 matmuls to OpenBLAS, whose own thread pool then competes with the OpenMP
// pool every convolution and fused kernel runs on. On oneDNN, which shares that pool, the fused
// Linear+ReLU's forward and backward run 3.0-3.4x faster than LibTorch's (BENCHMARKS.md).
// Other dtypes (bf16 under autocast already runs on oneDNN) and strides it cannot express go
// to at::mm unchanged. oneDNN's path records nothing for autograd: where autograd would record
// (grad mode on and an operand requiring grad) they run at::mm / at::addmm instead, so call them
// inside autograd functions, where grad mode is off, for the oneDNN path.
//
//   namespace kernels = afterburner::kernels;
//   torch::Tensor y = kernels::addmm(bias, x, weight.t());   // == at::addmm(bias, x, weight.t())
//   torch::Tensor grad_weight = kernels::mm(g.t(), x);        // == at::mm(g.t(), x)
//   torch::Tensor states = kernels::bmm(k.transpose(1, 2), v);  // == at::bmm(k.transpose(1, 2), v)
//   torch::Tensor h = kernels::addmm_fused(b1, x, w1t, kernels::Epilogue::gelu);  // gelu(addmm(...))
#pragma once

#include <torch/types.h>

namespace afterburner::kernels {

// a [M, K] times b [K, N].
torch::Tensor mm(const torch::Tensor& a, const torch::Tensor& b);

// a [B, M, K] times b [B, K, N]: one oneDNN matmul over the batch.
torch::Tensor bmm(const torch::Tensor& a, const torch::Tensor& b);

// c = beta c + a b into c [M, N] (rows contiguous, any distance apart), for kernels that fill
// slices of their own outputs: oneDNN for fp32, at::mm_out / addmm_ otherwise.
void mm_into(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b, float beta = 0.0f);

// bias [N] added to every row of a [M, K] times b [K, N].
torch::Tensor addmm(const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b);

// What follows the product in addmm_fused's single pass over its output.
enum class Epilogue { identity, gelu, relu };

// epilogue(bias [N] added to every row of a [M, K] times b [K, N]), gelu of the erf form or relu,
// for inference: one oneDNN matmul primitive with the bias and gelu applied to the fp32 accumulator
// as it is written out, where LibTorch makes three passes over the output (a GEMM, an add of the
// bias, an activation); relu follows in place (oneDNN's relu post-op would turn NaN into 0). a, b and bias all fp32 or all bf16 (the result rounded to bf16 once);
// other dtypes and the autograd case of mm run LibTorch's ops in sequence.
torch::Tensor addmm_fused(const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b,
                          Epilogue epilogue);

}  // namespace afterburner::kernels
