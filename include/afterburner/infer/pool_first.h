// An inference graph's 1x1 convolutions followed by an average pooling, DenseNet's transitions
// (BatchNorm, ReLU, 1x1 convolution, 2x2 average pooling), computed pooling first: both are linear
// and the convolution reads each pixel alone, so pooling its input gives the same sums (to
// rounding) and the convolution then runs over a quarter of the pixels. DenseNet-121's three
// transitions hold a tenth of its multiply-adds. The rewritten graph calls
// afterburner::avg_pool_pointwise_conv2d, an operator registered by this library: it runs in this
// process and is not meant to be saved.
//
//   auto graph = prepared.get_method("forward").graph();   // after move_onto_onednn
//   int rewritten = afterburner::infer::pool_before_pointwise_convolutions(graph);
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// Rewrites aten::avg_pool2d (no padding, no divisor override) of a prim::mkldnn_convolution of a
// constant fp32 1x1 weight, stride 1, no padding, one group, whose output only the pooling reads,
// onto afterburner::avg_pool_pointwise_conv2d. Each call reads its input's largest magnitude: an
// input holding NaN or an infinity, or values large enough that a sum could overflow in one order
// and not the other, is convolved and then pooled, as the graph did (its bits). Returns how many
// were rewritten.
int pool_before_pointwise_convolutions(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
