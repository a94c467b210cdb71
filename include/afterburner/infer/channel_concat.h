// DenseNet's concatenations of an inference graph into growing buffers. torchvision's DenseNet
// keeps a block's features in a list and each layer reads torch.cat(features, 1), so the block
// copies its early features once per layer; rewritten, the first concatenation reserves room for
// every feature appended later and each later one copies only the new features
// (kernels/channel_concat.h). Values are torch.cat's. The rewritten graph calls operators
// registered by this library: it runs in this process and is not meant to be saved.
//
//   auto graph = prepared.get_method("forward").graph();
//   int lists = afterburner::infer::concatenate_into_growing_buffers(graph);
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace afterburner::infer {

// Rewrites each list of tensors built in the graph's top block and used only by aten::append (of
// convolution outputs converted from oneDNN's layout: fp32 graphs) and aten::cat(list, 1) onto
// afterburner::concat_reserve (its first concatenation) and afterburner::concat_append (the later
// ones), which take the oneDNN tensors themselves. The room reserved is the channels of the tensors
// appended later where their producer tells (a oneDNN convolution of a packed constant weight);
// where it does not, those concatenations copy as before.
// Returns how many lists were rewritten.
int concatenate_into_growing_buffers(std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace afterburner::infer
