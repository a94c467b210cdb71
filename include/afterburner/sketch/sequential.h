// Sketching a C++ model: the Linear and Conv2d layers at the top level of a Sequential (as
// kernels::fuse rewrites it) replaced by SKLinear and SKConv2d initialised from their weights,
// where plan_layer says the sketch costs less. `afterburner train --sketch` trains models made so.
//
//   namespace sketch = afterburner::sketch;
//   auto model = afterburner::models::make_model("mlp");
//   auto sketched = sketch::sketch_sequential(model, sketch::SketchConfig().rank(64));
//   auto logits = sketched.model->forward(images);   // the 1024 x 10 classifier stays dense
//   auto fused = sketch::fuse_epilogues(sketched.model);  // SKLinear + ReLU in one node each
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

#include "afterburner/sketch/plan.h"

namespace afterburner::sketch {

struct SketchedSequential {
  torch::nn::Sequential model;  // a new container; layers not replaced are shared with the input
  SketchReport report;          // layer names are the Sequential's ("0", "3", ...)
};

// Layers keep their positions and names, so parameters are named "<layer>.S1s" and so on.
// The bias of a replaced layer is copied. Throws UsageError for a bad config.
SketchedSequential sketch_sequential(const torch::nn::Sequential& model, const SketchConfig& config);

struct FusedEpilogues {
  torch::nn::Sequential model;  // a new container; the layers it keeps are shared
  std::vector<std::string> fused;  // one entry per rewrite, e.g. "layers 1-3: SKLinear + ReLU + Dropout"
};

// Each top-level SKLinear without an epilogue followed by ReLU and/or Dropout, as an SKLinear over
// the same tensors with them as its epilogue (options relu, dropout: one autograd node, the same
// values from the same seed) and Identity in their places, so parameter names stay. Nothing is
// drawn from the random generators.
FusedEpilogues fuse_epilogues(const torch::nn::Sequential& model);

}  // namespace afterburner::sketch
