#include "afterburner/sketch/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "afterburner/core/error.h"
#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::sketch {
namespace {

int64_t product(const std::vector<int64_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>());
}

// Trainable weights each unit of rank adds: a column of S1_i and a row of S2_i per term for
// SKLinear, 2L filters for SKConv2d (the U buffers are fixed, not trained).
int64_t params_per_rank(int64_t terms, LayerKind kind, const std::vector<int64_t>& shape) {
  if (kind == LayerKind::linear) return terms * (shape[0] + shape[1]);
  return 2 * terms * shape[1] * shape[2] * shape[3];
}

// Why the sketch of `terms` terms of `rank` saves nothing (the layers' own sketch_saves_nothing
// rule), or "".
std::string saves_nothing(int64_t terms, LayerKind kind, const std::vector<int64_t>& shape, int64_t rank) {
  const int64_t sketches = 2 * terms * rank;
  if (kind == LayerKind::linear) {
    if (!sketch_saves_nothing(SKLinearOptions(shape[1], shape[0]).terms(terms).rank(rank))) return "";
    return fmt::format("rank {} would not save: 2Lk(d_in + d_out) = {} > d_in d_out = {}", rank,
                       sketches * (shape[0] + shape[1]), shape[0] * shape[1]);
  }
  if (!sketch_saves_nothing(SKConv2dOptions(shape[1], shape[0], {shape[2], shape[3]}).terms(terms).rank(rank))) {
    return "";
  }
  return fmt::format("rank {} would not save: 2Lk = {} >= C_out = {}", rank, sketches, shape[0]);
}

// Both layers keep the dense bias, one value per output.
int64_t bias_params(const std::vector<int64_t>& shape, bool has_bias) { return has_bias ? shape[0] : 0; }

int64_t parse_count(const std::string& text, const std::string& field, const std::string& item) {
  std::size_t end = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end == 0 || end != text.size() || value < 1) {
    throw UsageError(field, fmt::format("'{}': expected NAME=L:k, NAME=m:M or NAME=keep with L, k and M at least 1", item));
  }
  return value;
}

}  // namespace

LayerSketches parse_layer_sketches(const std::string& spec, const std::string& field) {
  LayerSketches layers;
  std::size_t start = 0;
  while (start < spec.size()) {
    const std::size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string item = spec.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const std::size_t equals = item.find('=');
    const std::string expected = fmt::format("'{}': expected NAME=L:k, NAME=m:M or NAME=keep", item);
    if (equals == 0 || equals == std::string::npos) throw UsageError(field, expected);
    const std::string name = item.substr(0, equals), value = item.substr(equals + 1);
    LayerSketch sketch;
    const std::size_t colon = value.find(':');
    if (value.rfind("m:", 0) == 0) {
      sketch.features = parse_count(value.substr(2), field, item);
    } else if (value != "keep") {
      if (colon == std::string::npos) throw UsageError(field, expected);
      sketch.terms = parse_count(value.substr(0, colon), field, item);
      sketch.rank = parse_count(value.substr(colon + 1), field, item);
    }
    if (!layers.emplace(name, sketch).second) throw UsageError(field, fmt::format("names layer '{}' twice", name));
  }
  return layers;
}

std::string format_layer_sketches(const LayerSketches& layers) {
  std::vector<std::string> items;
  for (const auto& [name, sketch] : layers) {
    if (sketch.features > 0) {
      items.push_back(fmt::format("{}=m:{}", name, sketch.features));
    } else {
      items.push_back(sketch.rank == 0 ? name + "=keep" : fmt::format("{}={}:{}", name, sketch.terms, sketch.rank));
    }
  }
  return fmt::format("{}", fmt::join(items, ","));
}

void check_config(const SketchConfig& c) {
  if (c.terms() < 1) throw UsageError("sketch terms", fmt::format("must be at least 1, got {}", c.terms()));
  if (c.rank() < 0) throw UsageError("sketch rank", fmt::format("must be at least 1, got {}", c.rank()));
  if (c.rank() > 0 && c.budget() != 0.0) throw UsageError("sketch rank", "give a rank or a budget, not both");
  if (c.attention_features() < 0) {
    throw UsageError("sketch attention features", fmt::format("must be at least 1, got {}", c.attention_features()));
  }
  for (const auto& [name, sketch] : c.layers()) {
    if (sketch.terms < 1 || sketch.rank < 0 || sketch.features < 0) {
      throw UsageError("sketch layers", fmt::format("{}: L must be at least 1, k and m at least 0, got L {} k {} m {}",
                                                    name, sketch.terms, sketch.rank, sketch.features));
    }
  }
  // Attention features alone, or layers of their own alone: no model-wide rank or budget needed.
  const bool sketches_attention_alone =
      c.rank() == 0 && c.budget() == 0.0 && (c.attention_features() > 0 || !c.layers().empty());
  if (c.rank() == 0 && !sketches_attention_alone && !(c.budget() > 0.0 && c.budget() < 1.0)) {
    throw UsageError("sketch budget", c.budget() == 0.0 ? "give a rank or a budget (or attention features, or layers, alone)"
                                                        : fmt::format("must be in (0, 1), got {}", c.budget()));
  }
}

const char* to_string(LayerKind kind) {
  switch (kind) {
    case LayerKind::linear: return "Linear";
    case LayerKind::conv2d: return "Conv2d";
    case LayerKind::attention: return "MultiheadAttention";
  }
  return "";
}

LayerPlan keep_layer(std::string name, LayerKind kind, std::vector<int64_t> weight_shape, bool has_bias,
                     std::string reason) {
  LayerPlan plan;
  plan.name = std::move(name);
  plan.kind = kind;
  plan.dense_params = product(weight_shape) + bias_params(weight_shape, has_bias);
  plan.sketched_params = plan.dense_params;
  plan.weight_shape = std::move(weight_shape);
  plan.kept_because = std::move(reason);
  return plan;
}

LayerPlan plan_layer(const SketchConfig& config, std::string name, LayerKind kind,
                     std::vector<int64_t> weight_shape, bool has_bias) {
  LayerPlan plan = keep_layer(std::move(name), kind, std::move(weight_shape), has_bias, "");
  const auto own = config.layers().find(plan.name);
  const bool per_layer = own != config.layers().end();
  if (per_layer && own->second.rank == 0) {
    plan.kept_because = "kept by the per-layer plan";  // also a Linear or Conv2d given m features
    return plan;
  }
  if (!per_layer && config.rank() == 0 && config.budget() == 0.0) {
    plan.kept_because = "no model-wide rank or budget given";
    return plan;
  }
  const int64_t terms = per_layer ? own->second.terms : config.terms();
  const int64_t dense_weight = product(plan.weight_shape);
  const int64_t per_rank = params_per_rank(terms, kind, plan.weight_shape);
  const int64_t rank = per_layer          ? own->second.rank
                       : config.rank() > 0 ? config.rank()
                                           : static_cast<int64_t>(std::floor(config.budget() *
                                                                             static_cast<double>(dense_weight) /
                                                                             static_cast<double>(per_rank)));
  if (rank < 1) {
    plan.kept_because = fmt::format("a budget of {} allows no rank-1 sketch ({} weights per unit of rank)",
                                    config.budget(), per_rank);
  } else if (std::string reason = saves_nothing(terms, kind, plan.weight_shape, rank); !reason.empty()) {
    plan.kept_because = std::move(reason);
  } else {
    plan.terms = terms;
    plan.rank = rank;
    plan.sketched_params = rank * per_rank + bias_params(plan.weight_shape, has_bias);
  }
  return plan;
}

LayerPlan plan_attention(const SketchConfig& config, std::string name, int64_t embed_dim, int64_t num_heads,
                         bool has_bias, std::string unsupported) {
  LayerPlan plan;
  plan.name = std::move(name);
  plan.kind = LayerKind::attention;
  plan.weight_shape = {3 * embed_dim, embed_dim};
  plan.num_heads = num_heads;
  plan.dense_params = 4 * embed_dim * embed_dim + (has_bias ? 4 * embed_dim : 0);  // in_proj and out_proj
  plan.sketched_params = plan.dense_params;  // the same weights as Wq, Wk, Wv, W0 (and biases)
  const auto own = config.layers().find(plan.name);
  const int64_t features = own != config.layers().end() ? own->second.features : config.attention_features();
  if (!unsupported.empty()) {
    plan.kept_because = std::move(unsupported);
  } else if (own != config.layers().end() && features == 0) {
    plan.kept_because = "kept by the per-layer plan";
  } else if (features == 0) {
    plan.kept_because = "exact attention kept (no number of random features given)";
  } else {
    plan.random_features = features;
  }
  return plan;
}

std::string describe(const LayerPlan& layer) {
  if (layer.kind == LayerKind::attention) {
    const std::string heads = layer.num_heads > 0 ? fmt::format(", {} heads", layer.num_heads) : "";  // traces hold none
    const std::string what = fmt::format("{} (MultiheadAttention, embed_dim {}{})", layer.name, layer.weight_shape.at(1), heads);
    if (!layer.replaced()) return fmt::format("{} kept: {}", what, layer.kept_because);
    return fmt::format("{}: {} random features per head, {} parameters", what, layer.random_features,
                       layer.sketched_params);
  }
  const std::string what = fmt::format("{} ({} [{}])", layer.name, to_string(layer.kind), fmt::join(layer.weight_shape, ", "));
  if (!layer.replaced()) return fmt::format("{} kept: {}", what, layer.kept_because);
  const std::string terms = layer.terms > 1 ? fmt::format("{} terms of ", layer.terms) : "";
  return fmt::format("{}: {}rank {}, {} of {} parameters", what, terms, layer.rank, layer.sketched_params,
                     layer.dense_params);
}

std::string describe(const SketchReport& report) {
  const double fewer = report.params_after > 0 ? static_cast<double>(report.params_before) / report.params_after : 0.0;
  return fmt::format("{} -> {} trainable parameters ({:.2f}x fewer), {} of {} layers sketched", report.params_before,
                     report.params_after, fewer, report.replaced_count(), report.layers.size());
}

void LayerPlan::keep(std::string reason) {
  kept_because = std::move(reason);
  terms = 0;
  rank = 0;
  random_features = 0;
  sketched_params = dense_params;
}

int64_t SketchReport::replaced_count() const {
  return std::count_if(layers.begin(), layers.end(), [](const LayerPlan& p) { return p.replaced(); });
}

}  // namespace afterburner::sketch
