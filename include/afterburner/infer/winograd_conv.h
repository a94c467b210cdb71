// fp32 3x3 convolutions of an inference graph by oneDNN's Winograd algorithm. optimize_for_inference
// runs every fp32 convolution as oneDNN's direct one (prim::mkldnn_convolution); for a 3x3 filter
// of stride 1, Winograd's F(4x4, 3x3) and F(2x2, 3x3) transforms compute the same sums with 2.25
// and 4 times fewer products: measured here 1.3x to 2.2x the direct convolution on the images
// ResNets and DenseNets carry. Its transforms round on their own: up to 2.3e-6 of the outputs'
// scale from the double-precision answer where the direct convolution is within 3e-7 (BENCHMARKS.md,
// "fp32 3x3 convolutions by Winograd's algorithm"). The rewritten graph calls
// afterburner::conv2d_winograd, an operator registered by this library: it runs in this process
// and is not meant to be saved.
//
//   Module prepared = torch::jit::optimize_for_inference(frozen);
//   auto graph = prepared.get_method("forward").graph();
//   int rewritten = afterburner::infer::convolve_3x3_by_winograd(graph);
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// Rewrites prim::mkldnn_convolution of a constant fp32 3x3 weight, stride 1, dilation 1, one
// group, padding 0 or 1 and channels in multiples of 16 (what oneDNN's Winograd kernels take)
// onto afterburner::conv2d_winograd. Per call that op keeps oneDNN's direct convolution where
// Winograd does not pay (small images and few channels: a rule measured on this machine kind,
// see winograd_pays) and wherever the Winograd result holds NaN or an infinity: its transforms
// mix the values of a whole tile (a NaN spreads to neighbours the direct sums do not reach,
// inf - inf makes NaN), so such calls are computed again the direct way, which gives LibTorch's
// answer. The transformed weights are made once per layout oneDNN asks for (it depends on the
// images' size) and kept: about 4x the weight's memory per layout. Returns how many were rewritten.
int convolve_3x3_by_winograd(std::shared_ptr<torch::jit::Graph>& graph);

// Whether Winograd pays over the direct convolution for `batch` images whose outputs are
// `height` x `width` pixels, `channels` in and `out_channels` out.
bool winograd_pays(int64_t batch, int64_t height, int64_t width, int64_t channels, int64_t out_channels);

}  // namespace afterburner::infer
