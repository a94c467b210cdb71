// Routes a frozen graph's matrix products with constant weights to oneDNN. After
// optimize_for_inference a Linear layer is aten::matmul(x, W^T) (+ aten::add of its bias); an
// fp32 GEMM then runs on OpenBLAS, whose own thread pool competes with the OpenMP pool the rest
// of the graph runs on: on 2 cores the fp32 mlp's throughput swung 4x between runs (BENCHMARKS.md);
// a bf16 one makes three passes over its output where a Linear + GELU (every transformer's MLP)
// needs one. The rewritten graph calls afterburner::linear, afterburner::linear_gelu
// (kernels::addmm, kernels::addmm_fused) and afterburner::mm (kernels::mm), operators registered
// with TorchScript by this library: it runs in this process and is not meant to be saved.
//
//   auto module = torch::jit::optimize_for_inference(frozen);
//   auto graph = module.get_method("forward").graph();
//   int routed = afterburner::infer::route_matmuls_to_onednn(graph);   // products rewritten
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

#include "afterburner/kernels/gemm.h"

namespace afterburner::infer {

// epilogue(x [..., K] times weight [K, N] + bias [N]) with x's leading dimensions kept, as
// aten::matmul does with a matrix on the right; no bias when it is undefined. What
// afterburner::linear computes: fp32 products without an epilogue on oneDNN's sgemm
// (kernels::addmm, which reads a transposed weight view as it lies), the others on its matmul
// primitive (kernels::addmm_fused).
torch::Tensor linear_on_onednn(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                               kernels::Epilogue epilogue = kernels::Epilogue::identity);

// residual + (x [N, H, W, K] times weight [K, C] + bias [C]).permute(0, 3, 1, 2) (residual
// [N, C, H, W]): a ConvNeXt block's end. Where the residual lies channels-last, one pass writes it
// plus the bias, onto which the product accumulates (kernels::mm_into); else the product, the
// permute and the sum one after the other.
torch::Tensor linear_add_permuted(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                  const torch::Tensor& residual);

// Rewrites matmul(x, W) + add(., b, 1), followed or not by gelu (erf form), where W is a constant
// fp32 or bf16 matrix and b a constant vector of W's width and dtype (with gelu: one oneDNN matmul
// with the bias and gelu applied as its output is written, kernels::addmm_fused), and lone
// matmul(x, W) of a constant fp32 W. Returns how many products were rewritten.
int route_matmuls_to_onednn(std::shared_ptr<torch::jit::Graph>& graph);

// After route_matmuls_to_onednn: ConvNeXt ends each block with its layer scale (a [C, 1, 1]
// constant), residual + scale * linear(x).permute(0, 3, 1, 2), three passes over the block's
// output after the product. Folds the scale into the linear layer's weight columns and bias (as
// BatchNorm folds into a convolution: the same to float rounding) and rewrites the rest as
// afterburner::linear_add_permuted. Returns how many.
int add_scaled_linears_to_residuals(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
