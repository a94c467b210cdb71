// Which dense layers a model's sketch replaces, and with what rank: one rule shared by the
// C++ modules (sketch_sequential), TorchScript files (sketch_script) and `afterburner sketch`.
//
//   namespace sketch = afterburner::sketch;
//   auto config = sketch::SketchConfig().terms(1).budget(0.25);   // or .rank(64)
//   auto plan = sketch::plan_layer(config, "fc1", sketch::LayerKind::linear, {1024, 784}, true);
//   if (plan.replaced()) use(plan.rank);                           // else plan.kept_because says why
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "afterburner/sketch/feature_kernel.h"

namespace afterburner::sketch {

// One layer's sketch, overriding the model-wide one: a Linear or Conv2d at L terms of rank k, an
// attention at m random features, or the layer kept (k and m 0).
struct LayerSketch {
  int64_t terms = 1, rank = 0, features = 0;
  bool operator==(const LayerSketch& other) const {
    return terms == other.terms && rank == other.rank && features == other.features;
  }
};

// Per-layer sketches by layer path ("fc1", "features.3").
using LayerSketches = std::map<std::string, LayerSketch>;

// "0=2:32,features.3=keep,encoder.attn=m:64" -> {"0": L 2 k 32, "features.3": kept,
// "encoder.attn": m 64}; the inverse of format_layer_sketches. Throws UsageError naming `field`
// for anything else.
LayerSketches parse_layer_sketches(const std::string& spec, const std::string& field = "--sketch-layers");
std::string format_layer_sketches(const LayerSketches& layers);

// At most one of rank and budget is set: a fixed k for every layer, or the largest k whose
// trainable weights stay within `budget` times the dense layer's; neither keeps Linear and Conv2d
// layers (when attention_features sketches attention alone). `layers` overrides both for the
// layers it names (a layer it names is sketched as it says, if its sketch costs less).
struct SketchConfig {
  TORCH_ARG(int64_t, terms) = 1;     // L
  TORCH_ARG(int64_t, rank) = 0;      // k; 0: derived from the budget
  TORCH_ARG(double, budget) = 0.0;   // in (0, 1); 0: a fixed rank
  // m random features per head in place of nn.MultiheadAttention's softmax (sketch_script); 0
  // keeps attention exact.
  TORCH_ARG(int64_t, attention_features) = 0;
  TORCH_ARG(FeatureKernel, attention_kernel) = FeatureKernel::softmax;
  TORCH_ARG(LayerSketches, layers);
};

// Throws UsageError naming "sketch terms", "sketch rank", "sketch budget", "sketch attention
// features" or "sketch layers".
void check_config(const SketchConfig& config);

enum class LayerKind { linear, conv2d, attention };
const char* to_string(LayerKind kind);

struct LayerPlan {
  std::string name;                   // the layer's path in its model, e.g. "0" or "features.3"
  LayerKind kind = LayerKind::linear;
  std::vector<int64_t> weight_shape;  // torch layout: [out, in], [C_out, C_in, Kh, Kw]; attention [3E, E]
  int64_t dense_params = 0;           // weight + bias
  int64_t sketched_params = 0;        // trainable after sketching (S1s, S2s, bias); dense_params if kept
  int64_t terms = 0;                  // L when replaced, 0 when kept
  int64_t rank = 0;                   // k when replaced, 0 when kept
  int64_t num_heads = 0;              // attention only
  int64_t random_features = 0;        // attention: m when replaced, 0 when kept
  std::string kept_because;           // empty when the layer is replaced
  bool replaced() const { return kept_because.empty(); }
  void keep(std::string reason);     // a plan that replaced the layer keeps it after all
};

// A layer is replaced when its sketch costs less than the dense layer (sketch_saves_nothing is
// false: SKLinear 2Lk(d_in + d_out) < d_in d_out, SKConv2d 2Lk < C_out); it then trains
// Lk(d_in + d_out) or 2Lk C_in Kh Kw weights. A budget gives the largest k whose trained
// weights stay within budget times the dense weight count.
LayerPlan plan_layer(const SketchConfig& config, std::string name, LayerKind kind,
                     std::vector<int64_t> weight_shape, bool has_bias);

// A plan for a layer that cannot be sketched at all (grouped convolution, ...).
LayerPlan keep_layer(std::string name, LayerKind kind, std::vector<int64_t> weight_shape, bool has_bias,
                     std::string reason);

// nn.MultiheadAttention of embed_dim E (its in_proj_weight [3E, E], out_proj [E, E]): replaced
// by random-feature attention of config.attention_features() features (the same parameters,
// renamed) unless that is 0 or `unsupported` says why it cannot be.
LayerPlan plan_attention(const SketchConfig& config, std::string name, int64_t embed_dim, int64_t num_heads,
                         bool has_bias, std::string unsupported = "");

struct SketchReport {
  std::vector<LayerPlan> layers;  // every Linear, Conv2d and MultiheadAttention found, replaced or kept
  int64_t params_before = 0;      // the model's trainable parameters
  int64_t params_after = 0;
  int64_t replaced_count() const;
};

// One line each: "fc1 (Linear [1024, 784]): rank 96, 174592 of 803840 parameters" or
// "... kept: <reason>"; "1863690 -> 382474 trainable parameters (4.87x fewer), 2 of 3 layers sketched".
std::string describe(const LayerPlan& layer);
std::string describe(const SketchReport& report);

}  // namespace afterburner::sketch
