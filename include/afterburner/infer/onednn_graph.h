// Rewrites of the graphs optimize_for_inference lays out on oneDNN that spare whole conversions of
// activations between oneDNN's layouts and dense tensors. The rewritten graph runs in this process
// only (it calls ops this library registers), as optimize_for_inference's does.
//
//   auto module = torch::jit::optimize_for_inference(frozen);
//   auto graph = module.get_method("forward").graph();
//   afterburner::infer::multiply_broadcasts_on_onednn(graph);
//   afterburner::infer::read_sizes_on_onednn(graph);
//   afterburner::infer::move_onto_onednn(graph);
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// x * scale, x [N, C, H, W] and scale [N, C, 1, 1] (a squeeze-and-excitation block's, as in every
// block of MobileNetV3 and EfficientNet), is prim::BroadcastMKLDNNTensors, which expands the scale
// to a full oneDNN tensor through a dense one, then oneDNN's product. Rewrites aten::mul and
// aten::mul_ of its two outputs as afterburner::broadcast_mul of its inputs, which multiplies in
// x's layout. Returns how many products were rewritten.
int multiply_broadcasts_on_onednn(std::shared_ptr<torch::jit::Graph>& graph);

// optimize_for_inference runs silu (EfficientNet's every activation) and a squeeze-and-excitation
// block's pooling and product on dense copies of oneDNN tensors, converting results back for the
// next convolution. Moves silu (our MkldnnCPU kernel: ATen's maths over oneDNN's buffer) and
// adaptive_avg_pool2d to 1x1 (oneDNN's, NaN-exact) onto the oneDNN tensor, out of place (it may
// have other readers), their results converted to dense only for readers that are not oneDNN's;
// then a product converted back, x times a dense scale, becomes afterburner::broadcast_mul on x's
// layout (sizes read as read_sizes_on_onednn does); and a oneDNN tensor converted to dense and
// back (a residual read after such a block) is read as it was, where neither is written in place.
// Returns how many ops were moved and conversions spared.
int move_onto_onednn(std::shared_ptr<torch::jit::Graph>& graph);

// optimize_for_inference converts a oneDNN tensor to a dense one to read its sizes (a size() in
// the model's code: MobileNetV3's and EfficientNet's blocks): aten::size and aten::dim read the
// oneDNN tensor instead, and the conversion goes where nothing else reads it. Returns how many
// reads were rewritten.
int read_sizes_on_onednn(std::shared_ptr<torch::jit::Graph>& graph);

// DenseNet's layers begin with BatchNorm and ReLU on the concatenation of the features before
// them, which optimize_for_inference computes densely (its oneDNN subgraphs stop at aten::cat) and
// then converts for the layer's convolution: three passes over the features. Rewrites
// to_mkldnn(relu(batch_norm(x))) of an inference BatchNorm with constant statistics, each result
// read by the next op only, as afterburner::scale_shift_relu_to_onednn: one pass, not three; scale and shift
// computed from the statistics as LibTorch's batch_norm computes them. The op also returns a bound
// of its values, which fuse_activations_into_convolutions hands the convolution reading them.
// Returns how many were.
int batch_norm_relu_into_onednn(std::shared_ptr<torch::jit::Graph>& graph);

// optimize_for_inference lays every convolution out on oneDNN, converting its input from a dense
// tensor and its result back for dense readers. ConvNeXt's blocks compute between permutes to and
// from channels-last (a depthwise convolution, x.permute(0, 2, 3, 1), LayerNorm and Linear layers
// on the channels, permute(0, 3, 1, 2), the residual sum): around each depthwise convolution, which
// itself makes one pass over the activations, the conversions made four (to_mkldnn a contiguous
// copy then oneDNN's layout, to_dense an NCHW tensor, which the permute hands LayerNorm to copy
// again). Where one result of a chain of convolutions (the readers of a conversion to oneDNN all
// convolutions, of their results convolutions of the chain or conversions to dense, none written
// in place) is permuted to channels-last, computes the chain as aten::conv2d of the dense tensors:
// LibTorch's convolution, on oneDNN too, keeps a channels-last input's layout, so the permute of
// its result is contiguous. Returns how many convolutions were rewritten.
int convolve_channels_last_densely(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
