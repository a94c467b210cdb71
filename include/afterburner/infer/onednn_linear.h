// Routes a frozen graph's fp32 matrix products with constant weights to oneDNN's GEMM. After
// optimize_for_inference a Linear layer is aten::matmul(x, W^T) (+ aten::add of its bias); its
// GEMM then runs on OpenBLAS, whose own thread pool competes with the OpenMP pool the rest of
// the graph runs on: on 2 cores the fp32 mlp's throughput swung 4x between runs (BENCHMARKS.md).
// The rewritten graph calls afterburner::linear (kernels::addmm) and afterburner::mm
// (kernels::mm), operators registered with TorchScript by this library: it runs in this process
// and is not meant to be saved.
//
//   auto module = torch::jit::optimize_for_inference(frozen);
//   auto graph = module.get_method("forward").graph();
//   int routed = afterburner::infer::route_matmuls_to_onednn(graph);   // products rewritten
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// Rewrites matmul(x, W) + add(., b, 1) and lone matmul(x, W) where W is a constant fp32 matrix
// and b a constant fp32 vector of W's width. Returns how many products were rewritten.
int route_matmuls_to_onednn(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
