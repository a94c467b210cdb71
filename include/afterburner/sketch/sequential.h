// Sketching a C++ model: the Linear and Conv2d layers at the top level of a Sequential (as
// kernels::fuse rewrites it) replaced by SKLinear and SKConv2d initialised from their weights,
// where plan_layer says the sketch costs less. `afterburner train --sketch` trains models made so.
//
//   namespace sketch = afterburner::sketch;
//   auto model = afterburner::models::make_model("mlp");
//   auto sketched = sketch::sketch_sequential(model, sketch::SketchConfig().rank(64));
//   auto logits = sketched.model->forward(images);   // the 1024 x 10 classifier stays dense
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "afterburner/sketch/plan.h"

namespace afterburner::sketch {

struct SketchedSequential {
  torch::nn::Sequential model;  // a new container; layers not replaced are shared with the input
  SketchReport report;          // layer names are the Sequential's ("0", "3", ...)
};

// Layers keep their positions and names, so parameters are named "<layer>.S1s" and so on.
// The bias of a replaced layer is copied. Throws UsageError for a bad config.
SketchedSequential sketch_sequential(const torch::nn::Sequential& model, const SketchConfig& config);

}  // namespace afterburner::sketch
