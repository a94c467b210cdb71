// What torch::jit::optimize_for_inference lays out for oneDNN, checked (and two bugs of the pass
// worked around) before it does. The pass moves each convolution with a constant weight, and the
// max pooling and element-wise ops after it, to oneDNN, trusting their arguments: its weight
// reorder reads the weight's dimensions and the stride, padding and dilation per spatial dimension
// (LibTorch 1.13 does not expand a single value there) and divides by the stride; the converted
// convolution and max pooling then run through at::native's mkldnn functions, which skip eager's
// checks. Found by fuzz_model_graph, each in Python's torch.jit.optimize_for_inference too: a
// stride of 0 divided by zero (SIGFPE) in the layout and at max pooling's first forward, a 1-D
// weight was read past its end, and a convolution whose bias was its own weight dereferenced an
// empty optional (SIGSEGV). Eager refuses every value refused here when the model runs, so no
// model that could run is refused.
//
//   Module frozen = torch::jit::freeze(module);
//   afterburner::infer::check_onednn_layouts(*frozen.get_method("forward").graph());  // throws Error
//   afterburner::infer::clamp_bounds_as_floats(*frozen.get_method("forward").graph());
//   afterburner::infer::average_pools_as_aten(*frozen.get_method("forward").graph());
//   Module prepared = torch::jit::optimize_for_inference(frozen);
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace afterburner::infer {

// `graph` is frozen and constant-propagated, as the pass finds it. Throws Error for the first
// convolution (aten::conv2d, conv3d, or a traced aten::_convolution that is not transposed) with
// a constant weight, or max pooling (aten::max_pool2d, max_pool3d), whose constant arguments it
// cannot take, in one line: "infer: aten::conv2d with stride [1, 0] is not supported: stride
// must be at least 1".
void check_onednn_layouts(const torch::jit::Graph& graph);

// Gives aten::clamp of a convolution's (or linear layer's, or norm's) output float bounds where it
// had None or an integer: the pass asserts each bound is a double (LibTorch 1.13, Python's too:
// `torch.clamp(conv(x), min=0.0)`, a common form of ReLU, stopped optimize_for_inference with
// "isDouble() INTERNAL ASSERT FAILED"). None becomes the infinity of its side, which clamps
// nothing; the values are the same. Returns how many clamps were rewritten.
int clamp_bounds_as_floats(torch::jit::Graph& graph);

// Keeps off oneDNN the average poolings the pass would move there and oneDNN computes otherwise
// than ATen (LibTorch 1.13, Python's too): with ceil_mode and count_include_pad, oneDNN counts the
// last window's overhang past the input as padding (AvgPool2d(2, 2, ceil_mode=True) after a
// convolution, on an odd size, answered wrongly), and a divisor_override fails at the first call
// ("mkldnn_avg_pool2d operator does not support divisor"). Without padding, ATen's windows count
// the pixels they cover whether count_include_pad is set or not: there it is unset, and the pooling
// stays on oneDNN. The others become afterburner::avg_pool2d_as_aten, ATen's avg_pool2d under a
// name the pass does not move. Returns how many were rewritten.
int average_pools_as_aten(torch::jit::Graph& graph);

}  // namespace afterburner::infer
