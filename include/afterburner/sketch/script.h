// Sketched layers in TorchScript: a whole model file rewritten (`afterburner sketch`), or one
// layer scripted for export. Python's torch.jit.load runs the result; each sketched layer is a
// submodule holding S1s, S2s (SKLinear only), U1s, U2s (SKLinear only) and bias; each
// random-feature attention Wq, Wk, Wv, W0, bq, bk, bv, b0 and projection_matrix.
//
//   namespace sketch = afterburner::sketch;
//   torch::jit::Module model = torch::jit::load("mlp.pt");
//   auto report = sketch::sketch_script(model, sketch::SketchConfig().terms(1).rank(64));
//   for (const auto& layer : report.layers) std::cout << layer.name << " " << layer.replaced() << "\n";
//   model.save("mlp-sketched.pt");
#pragma once

#include <torch/csrc/jit/api/module.h>

#include <memory>

#include "afterburner/sketch/plan.h"

namespace afterburner::sketch {

class SKLinearImpl;
class SKConv2dImpl;
class RandMultiHeadAttentionImpl;

// The layer's state (copied) and a TorchScript forward computing what its C++ forward does (the
// attention's: forward(query, key, value) -> out, batch first, without a mask).
torch::jit::Module script_layer(const SKLinearImpl& layer, const std::shared_ptr<torch::jit::CompilationUnit>& unit);
torch::jit::Module script_layer(const SKConv2dImpl& layer, const std::shared_ptr<torch::jit::CompilationUnit>& unit);
torch::jit::Module script_layer(const RandMultiHeadAttentionImpl& layer,
                                const std::shared_ptr<torch::jit::CompilationUnit>& unit);

// Replaces, in place, every submodule whose forward is exactly one linear or conv2d of its own
// weight and bias (torch.nn.Linear and Conv2d as Python scripts or traces them, afterburner's
// exports) by a sketched layer initialised from that weight, where plan_layer says the sketch
// costs less; and, given config.attention_features(), every scripted nn.MultiheadAttention
// (alone, in nn.TransformerEncoderLayer, torchvision's ViT) by random-feature attention holding
// its weights as Wq, Wk, Wv, W0 (and biases), called as MHA is (rand_multihead_attention_with_mha_masks:
// its layout and masks; a causal attn_mask makes it causal) and returning (out, None). Those
// layers call afterburner's ops: Python loads the file after `import afterburner`. Where a layer
// is replaced, nn.TransformerEncoderLayer's and TransformerEncoder's evaluation fast paths (which
// read their layers' weights) are removed: the path they train with computes the same function.
// Layers that cannot be replaced are reported with the reason and left as they are: a grouped,
// dilated or transposed convolution, a traced attention, a layer whose module is used other than
// by calling it, an attention whose caller reads its weights, a layer sharing its TorchScript
// class with one that is kept. Checks that the result reloads.
// Throws UsageError for a bad config.
SketchReport sketch_script(torch::jit::Module& model, const SketchConfig& config);

}  // namespace afterburner::sketch
