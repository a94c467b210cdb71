// Keeps NaN and infinities where LibTorch's own ops keep them in a graph that
// torch::jit::optimize_for_inference laid out for oneDNN. oneDNN's relu (max(x, 0) in its
// kernels), max pooling and sigmoid drop NaN: the served model answered finite numbers for an
// image with a NaN or +inf pixel, where Python's torch.jit.load answers NaN (issue 25). And
// LibTorch 1.13 runs hardtanh, relu6, clamp, hardswish and hardsigmoid as ATen kernels over the
// first numel() elements of oneDNN's buffer, which for channels that do not fill oneDNN's
// blocks of 8 or 16 is not the whole tensor: wrong for finite inputs too.
//
//   auto module = torch::jit::optimize_for_inference(frozen);
//   auto graph = module.get_method("forward").graph();
//   int rewritten = afterburner::infer::propagate_non_finite_as_aten(graph);
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// Rewrites the ops on the graph's oneDNN tensors (between aten::to_mkldnn and aten::to_dense)
// whose results differ from LibTorch's dense ops:
//   relu then max_pool2d   -> afterburner::relu_max_pool2d on oneDNN's buffer (one op)
//   any other relu         -> hardtanh(x, 0, inf) on oneDNN's buffer (in place if the relu was)
//   hardtanh, relu6, clamp, hardswish, hardsigmoid -> their ATen op on oneDNN's buffer, which
//                             our MkldnnCPU kernels compute over the whole buffer
//   other ops not known to propagate as LibTorch's do (max pooling, sigmoid, ...) -> their
//                             dense LibTorch op
// Finite inputs give the same results as before, up to the sign of zero (and, for the ops on
// padded channels, right ones). Returns how many ops were rewritten. The graph runs in this
// process only, as optimize_for_inference's does.
int propagate_non_finite_as_aten(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
