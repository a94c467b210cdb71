// bf16 convolutions of an inference graph on weights packed once into the blocked layout oneDNN's
// convolution reads. LibTorch 1.13 runs a bf16 convolution (a frozen bf16 graph's, or eager
// autocast's) through oneDNN on its dense weight and has oneDNN reorder that weight into the
// blocked layout on every call; for fp32 graphs optimize_for_inference packs weights once, for
// bf16 ones it does not. The rewritten graph calls afterburner::conv2d_packed, an operator
// registered by this library: it runs in this process and is not meant to be saved.
//
//   auto graph = prepared.get_method("forward").graph();
//   int packed = afterburner::infer::pack_bf16_convolutions(graph);   // convolutions rewritten
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// Rewrites aten::conv2d of a constant bf16 weight (and constant integer stride, padding, dilation
// and groups) onto afterburner::conv2d_packed, which computes the same
// oneDNN convolution (the same bits) on the weight packed here. Returns how many were rewritten.
int pack_bf16_convolutions(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
