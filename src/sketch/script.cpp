#include "afterburner/sketch/script.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/runtime/graph_iterator.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "afterburner/core/error.h"
#include "afterburner/kernels/fuse.h"
#include "afterburner/kernels/script_rewrites.h"
#include "afterburner/sketch/rand_attention.h"
#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::sketch {
namespace jit = torch::jit;
namespace {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
using NamedValues = std::vector<std::pair<std::string, c10::IValue>>;

// The sizes come from the tensors, so sketched layers of any size share one TorchScript class.
// The 1/(2L) scales the second operand rather than the output: once frozen, both operands are
// constants and the layer is two matmuls and a bias add (which infer routes to oneDNN).
const char* const kLinearForward = R"(
def forward(self, x):
    terms = self.S1s.size(0)
    columns = terms * self.S1s.size(2)
    first = torch.cat([self.S1s.permute([1, 0, 2]).reshape([-1, columns]),
                       self.U2s.permute([1, 0, 2]).reshape([-1, columns])], 1)
    second = torch.cat([self.U1s.reshape([columns, -1]), self.S2s.reshape([columns, -1])], 0) * (0.5 / terms)
    y = torch.matmul(torch.matmul(x, first), second){bias}
    return {epilogue}
)";

// U1s [2L, k, C_out] becomes the weight [C_out, 2Lk, 1, 1] of a 1x1 convolution mixing the
// 2Lk sketched channels, channel i k + kappa holding term i's kappa-th filter.
const char* const kConvForward = R"(
def forward(self, x):
    sketched = torch.conv2d(x, self.S1s, None, [{stride}], [{padding}])
    mix = self.U1s.reshape([-1, self.U1s.size(2)]).t().unsqueeze(2).unsqueeze(3)
    return torch.conv2d(sketched, mix * (1.0 / self.U1s.size(0)), {bias})
)";

// nn.MultiheadAttention's forward, signature and result type as LibTorch 1.13 scripts it (its
// callers stay as they are), computed by random features: the weights, which they do not
// compute, are None (sketch_script replaces only layers whose callers do not read them).
const char* const kAttentionForward = R"(
def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
            need_weights: bool = True, attn_mask: Optional[Tensor] = None,
            average_attn_weights: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    out = afterburner.rand_mha_with_mha_masks(query, key, value, key_padding_mask, attn_mask, self.batch_first,
                                              self.Wq, self.Wk, self.Wv, self.W0, {bq}, {bk}, {bv}, {b0},
                                              self.projection_matrix, self.num_heads, self.kernel_fn, self.dropout,
                                              self.training)
    return out, None
)";

// sketch::RandMultiHeadAttention's own call, for C++ models that hold one (the zoo's performer):
// batch-first query, key and value in, the output out.
const char* const kRandAttentionForward = R"(
def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    return afterburner.rand_mha(query, key, value, self.Wq, self.Wk, self.Wv, self.W0, {bq}, {bk}, {bv}, {b0},
                                self.projection_matrix, self.num_heads, self.kernel_fn, self.causal, self.dropout,
                                self.training)
)";

// Attributes of nn.MultiheadAttention's configuration its replacement holds too (ScriptedLayers
// makes them), with the same values: code that reads them (TransformerEncoderLayer's checks for
// its fast path) reads them from either.
const std::set<std::string> kAttentionAttributes{"embed_dim", "num_heads", "batch_first", "dropout",
                                                 "_qkv_same_embed_dim"};

// Sketched layers as TorchScript modules: one class per distinct forward source.
class ScriptedLayers {
 public:
  explicit ScriptedLayers(std::shared_ptr<jit::CompilationUnit> unit) : unit_(std::move(unit)) {}

  jit::Module make(const std::string& kind, const std::string& source, const NamedTensors& parameters,
                   const NamedTensors& buffers, bool training, const NamedValues& attributes = {}) {
    auto known = classes_.find(source);
    jit::Module out = known != classes_.end()
                          ? jit::Module(unit_, known->second)
                          : jit::Module(c10::QualifiedName("__torch__.afterburner.sketch." + kind), unit_, true);
    for (const auto& [name, tensor] : parameters) {
      out.register_parameter(name, tensor.detach().clone().requires_grad_(tensor.requires_grad()), false);
    }
    for (const auto& [name, tensor] : buffers) out.register_buffer(name, tensor.detach().clone());
    for (const auto& [name, value] : attributes) out.register_attribute(name, value.type(), value);
    out.register_attribute("training", c10::BoolType::get(), training);  // read by forwards that drop out
    if (known == classes_.end()) {
      out.define(source, kernels::resolver_with_afterburner_ops());
      classes_.emplace(source, out.type());
    }
    return out;
  }

  jit::Module make(const SKLinearImpl& layer, bool training) {
    NamedTensors parameters{{"S1s", layer.S1s}, {"S2s", layer.S2s}};
    if (layer.bias.defined()) parameters.emplace_back("bias", layer.bias);
    // The layer's ReLU and dropout (SKLinearOptions), as torch.relu and torch.dropout.
    const auto& o = layer.options;
    std::string epilogue = o.relu() ? "torch.relu(y)" : "y";
    if (o.dropout() > 0) epilogue = fmt::format("torch.dropout({}, {}, self.training)", epilogue, o.dropout());
    const std::string source = fmt::format(kLinearForward, fmt::arg("bias", layer.bias.defined() ? " + self.bias" : ""),
                                           fmt::arg("epilogue", epilogue));
    return make("SKLinear", source, parameters, {{"U1s", layer.U1s}, {"U2s", layer.U2s}}, training);
  }

  jit::Module make(const SKConv2dImpl& layer, bool training) {
    NamedTensors parameters{{"S1s", layer.S1s}};
    if (layer.bias.defined()) parameters.emplace_back("bias", layer.bias);
    const auto& o = layer.options;
    const std::string source =
        fmt::format(kConvForward, fmt::arg("stride", fmt::join(*o.stride(), ", ")),
                    fmt::arg("padding", fmt::join(*o.padding(), ", ")),
                    fmt::arg("bias", layer.bias.defined() ? "self.bias" : "None"));
    return make("SKConv2d", source, parameters, {{"U1s", layer.U1s}}, training);
  }

  // As nn.MultiheadAttention's replacement (kAttentionForward), or with its own call (`native`,
  // kRandAttentionForward).
  jit::Module make(const RandMultiHeadAttentionImpl& layer, bool batch_first, bool training, bool native = false) {
    const bool bias = layer.options.bias();
    NamedTensors parameters{{"Wq", layer.Wq}, {"Wk", layer.Wk}, {"Wv", layer.Wv}, {"W0", layer.W0}};
    if (bias) parameters.insert(parameters.end(), {{"bq", layer.bq}, {"bk", layer.bk}, {"bv", layer.bv}, {"b0", layer.b0}});
    auto bias_of = [&](const char* name) { return bias ? fmt::format("self.{}", name) : std::string("None"); };
    const std::string source =
        fmt::format(native ? kRandAttentionForward : kAttentionForward, fmt::arg("bq", bias_of("bq")),
                    fmt::arg("bk", bias_of("bk")), fmt::arg("bv", bias_of("bv")), fmt::arg("b0", bias_of("b0")));
    const auto& o = layer.options;  // kAttentionAttributes, and the feature map
    NamedValues attributes{{"embed_dim", o.embed_dim()}, {"num_heads", o.num_heads()}, {"batch_first", batch_first},
                           {"dropout", o.dropout()}, {"_qkv_same_embed_dim", true}, {"kernel_fn", to_string(o.kernel())}};
    if (native) attributes.emplace_back("causal", o.causal());
    return make("RandMultiHeadAttention", source, parameters, {{"projection_matrix", layer.projection_matrix}}, training,
                attributes);
  }

 private:
  std::shared_ptr<jit::CompilationUnit> unit_;
  std::map<std::string, c10::ClassTypePtr> classes_;
};

// A submodule whose forward is one linear or 2-D convolution of its own weight and bias, or a
// scripted nn.MultiheadAttention.
struct DenseLayer {
  LayerKind kind = LayerKind::linear;
  torch::Tensor weight, bias;             // bias undefined when the layer has none; attention: in_proj's
  std::vector<int64_t> stride, padding;   // conv2d only
  torch::Tensor out_weight, out_bias;     // attention only: out_proj's
  int64_t num_heads = 0;                  // attention only
  bool batch_first = false;               // attention only
  double dropout = 0.0;                   // attention only
  std::string unsupported;                // why it cannot be sketched; empty if it can
};

bool is_self_attribute(const jit::Value* value, const jit::Value* self, const char* name) {
  const jit::Node* node = value->node();
  return node->kind() == c10::prim::GetAttr && node->input(0) == self && node->s(c10::attr::name) == name;
}

std::optional<std::vector<int64_t>> constant_pair(const jit::Value* value) {
  auto constant = jit::toIValue(value);
  if (!constant || !constant->isIntList()) return std::nullopt;
  std::vector<int64_t> pair = constant->toIntVector();
  if (pair.size() == 1) pair.push_back(pair[0]);
  if (pair.size() != 2) return std::nullopt;
  return pair;
}

// stride, padding, dilation and groups of aten::conv2d(x, weight, bias, stride, padding,
// dilation, groups), or of aten::_convolution(x, weight, bias, stride, padding, dilation,
// transposed, output_padding, groups, ...) as tracing records a convolution.
void read_conv_arguments(const jit::Node* conv, DenseLayer& layer) {
  const bool traced = conv->kind() == c10::aten::_convolution;
  auto stride = constant_pair(conv->input(3)), padding = constant_pair(conv->input(4));
  auto dilation = constant_pair(conv->input(5));
  auto groups = jit::toIValue(conv->input(traced ? 8 : 6));
  auto transposed = traced ? jit::toIValue(conv->input(6)) : c10::optional<c10::IValue>(false);
  if (!transposed || !transposed->isBool() || transposed->toBool()) {
    layer.unsupported = "transposed convolutions are not sketched";
  } else if (!stride || !dilation || !groups || !groups->isInt()) {
    layer.unsupported = "its stride, dilation or groups are not constants";
  } else if (!padding) {
    layer.unsupported = "its padding is not a pair of integers";
  } else if (groups->toInt() != 1) {
    layer.unsupported = "grouped convolutions are not sketched";
  } else if ((*dilation)[0] != 1 || (*dilation)[1] != 1) {
    layer.unsupported = "dilated convolutions are not sketched";
  } else {
    layer.stride = *stride;
    layer.padding = *padding;
  }
}

// The forward graph, inlined and constant-folded, must be exactly op(x, self.weight, self.bias
// or None, constants...) returned as it is. Inlined from the callees' own graphs: jit::Inline
// would cache each callee's inlined graph, and a module nested in this one (a residual block's
// shortcut Sequential) would go on running the dense layer sketch_script then replaces.
std::optional<DenseLayer> as_dense_layer(const jit::Module& module) {
  auto method = module.find_method("forward");
  if (!method) return std::nullopt;
  std::shared_ptr<jit::Graph> graph = jit::toGraphFunction(method->function()).graph()->copy();
  kernels::inline_calls(*graph);
  jit::ConstantPropagation(graph);
  if (graph->inputs().size() != 2 || graph->outputs().size() != 1) return std::nullopt;
  const jit::Value* self = graph->inputs()[0];
  const jit::Node* op = nullptr;
  for (const jit::Node* node : graph->nodes()) {
    if (node->kind() == c10::prim::Constant || node->kind() == c10::prim::GetAttr) continue;
    if (op) return std::nullopt;
    op = node;
  }
  if (!op || op->outputs().size() != 1 || graph->outputs()[0] != op->output()) return std::nullopt;
  const bool linear = op->kind() == c10::aten::linear && op->inputs().size() == 3;
  const bool conv = (op->kind() == c10::aten::conv2d && op->inputs().size() == 7) ||
                    (op->kind() == c10::aten::_convolution && op->inputs().size() == 13);
  if ((!linear && !conv) || op->input(0) != graph->inputs()[1] || !is_self_attribute(op->input(1), self, "weight")) {
    return std::nullopt;
  }
  const bool reads_bias = is_self_attribute(op->input(2), self, "bias");
  if (!reads_bias && !op->input(2)->mustBeNone()) return std::nullopt;
  DenseLayer layer;
  layer.kind = linear ? LayerKind::linear : LayerKind::conv2d;
  layer.weight = module.attr("weight").toTensor();
  if (layer.weight.dim() != (linear ? 2 : 4)) return std::nullopt;
  if (reads_bias && module.attr("bias").isTensor()) layer.bias = module.attr("bias").toTensor();
  if (conv) read_conv_arguments(op, layer);
  return layer;
}

// The module's attribute `name`, or its class's constant of that name (batch_first is one).
c10::IValue attribute_or_constant(const jit::Module& module, const char* name) {
  if (module.type()->hasConstant(name)) return module.type()->getConstant(name);
  return module.attr(name);
}

// A scripted (or traced) nn.MultiheadAttention, with why it cannot be replaced if it cannot.
std::optional<DenseLayer> as_attention_layer(const jit::Module& module) {
  if (!kernels::is_torch_nn(module.type(), "MultiheadAttention")) return std::nullopt;
  DenseLayer layer;
  layer.kind = LayerKind::attention;
  if (module.hasattr("in_proj_weight") && module.attr("in_proj_weight").isTensor()) {
    layer.weight = module.attr("in_proj_weight").toTensor();
  }
  if (module.hasattr("num_heads")) layer.num_heads = module.attr("num_heads").toInt();
  layer.unsupported = kernels::why_not_rewritable_attention(module.type());
  if (!layer.unsupported.empty()) return layer;
  if (module.attr("add_zero_attn").toBool()) {
    layer.unsupported = "add_zero_attn is not sketched";
  } else if (!module.attr("bias_k").isNone()) {
    layer.unsupported = "add_bias_kv is not sketched";
  }
  if (!layer.unsupported.empty()) return layer;
  if (module.attr("in_proj_bias").isTensor()) layer.bias = module.attr("in_proj_bias").toTensor();
  const jit::Module out_proj = module.attr("out_proj").toModule();
  layer.out_weight = out_proj.attr("weight").toTensor();
  if (out_proj.attr("bias").isTensor()) layer.out_bias = out_proj.attr("bias").toTensor();
  layer.batch_first = attribute_or_constant(module, "batch_first").toBool();
  layer.dropout = module.attr("dropout").toDouble();
  return layer;
}

LayerPlan plan_for(const SketchConfig& config, const std::string& path, const DenseLayer& layer) {
  const bool has_bias = layer.bias.defined();
  if (layer.kind == LayerKind::attention) {
    const int64_t embed_dim = layer.weight.defined() ? layer.weight.size(1) : 0;
    return plan_attention(config, path, embed_dim, layer.num_heads, has_bias, layer.unsupported);
  }
  const std::vector<int64_t> shape = layer.weight.sizes().vec();
  return layer.unsupported.empty() ? plan_layer(config, path, layer.kind, shape, has_bias)
                                   : keep_layer(path, layer.kind, shape, has_bias, layer.unsupported);
}

struct Candidate {
  jit::Module parent;
  std::string attribute;  // the layer's name in its parent
  jit::Module module;
  DenseLayer layer;
  LayerPlan plan;
};

void find_candidates(const jit::Module& parent, const std::string& prefix, const SketchConfig& config,
                     std::vector<Candidate>& out) {
  for (const jit::NameModule& child : parent.named_children()) {
    const std::string path = prefix.empty() ? child.name : prefix + "." + child.name;
    auto layer = as_attention_layer(child.value);
    if (!layer) layer = as_dense_layer(child.value);
    if (!layer) {
      find_candidates(child.value, path, config, out);
      continue;
    }
    LayerPlan plan = plan_for(config, path, *layer);
    out.push_back({parent, child.name, child.value, std::move(*layer), std::move(plan)});
  }
}

// Calls `visit` for every `<object of parent_type>.<attribute>` read in the model's code.
void for_each_read(const jit::Module& model, const c10::ClassTypePtr& parent_type, const std::string& attribute,
                   const std::function<void(jit::Node*, const jit::Function&)>& visit) {
  std::set<const c10::ClassType*> seen;
  for (const jit::Module& module : model.modules()) {
    if (!seen.insert(module.type().get()).second) continue;
    for (jit::Function* function : module.type()->methods()) {
      std::shared_ptr<jit::Graph> graph = jit::toGraphFunction(*function).graph();
      jit::DepthFirstGraphNodeIterator nodes(graph);
      for (jit::Node* node = nodes.next(); node; node = nodes.next()) {
        if (node->kind() == c10::prim::GetAttr && node->s(c10::attr::name) == attribute &&
            node->input(0)->type()->cast<c10::ClassType>() == parent_type) {
          visit(node, *function);
        }
      }
    }
  }
}

// The (output, weights) an attention call returns is read for its output alone.
bool reads_only_the_output(const jit::Node* call) {
  for (const jit::Use& u : call->output()->uses()) {
    const jit::Node* user = u.user;
    if (user->kind() == c10::prim::TupleUnpack && user->output(1)->uses().empty()) continue;
    const auto index = user->kind() == c10::prim::TupleIndex ? jit::toIValue(user->input(1)) : c10::nullopt;
    if (!index || !index->isInt() || index->toInt() != 0) return false;
  }
  return true;
}

// Why the layer's module cannot change class: some code does more than call its forward, or
// reads attention weights random features do not compute.
std::string other_use(const jit::Module& model, const Candidate& candidate) {
  std::string use;
  for_each_read(model, candidate.parent.type(), candidate.attribute, [&](jit::Node* read, const jit::Function& in) {
    for (const jit::Use& u : read->output()->uses()) {
      const bool calls_forward = u.user->kind() == c10::prim::CallMethod && u.offset == 0 &&
                                 u.user->s(c10::attr::name) == "forward";
      const bool attention = candidate.layer.kind == LayerKind::attention;
      const bool reads_held_attribute = attention && u.user->kind() == c10::prim::GetAttr &&
                                        kAttentionAttributes.count(u.user->s(c10::attr::name)) > 0;
      if (!use.empty() || reads_held_attribute) continue;
      if (!calls_forward) {
        use = fmt::format("{} uses the module other than by calling it", in.name());
      } else if (attention && !reads_only_the_output(u.user)) {
        use = fmt::format("{} reads the attention weights, which random features do not compute", in.name());
      }
    }
  });
  return use;
}

// TransformerEncoderLayer's and TransformerEncoder's evaluation fast paths read the weights of
// their attention and Linear layers: removed, so that those can change class (the path they train
// with computes the same function).
void remove_fast_paths_of_transformers(const jit::Module& model) {
  std::set<const c10::ClassType*> seen;
  for (const jit::Module& module : model.modules()) {
    const c10::ClassTypePtr& type = module.type();
    if (!seen.insert(type.get()).second) continue;
    if (!kernels::is_torch_nn(type, "TransformerEncoderLayer") && !kernels::is_torch_nn(type, "TransformerEncoder")) {
      continue;
    }
    for (jit::Function* method : type->methods()) {
      jit::GraphFunction& function = jit::toGraphFunction(*method);
      if (kernels::remove_transformer_fast_paths(function.graph()) > 0) function.clear_optimized_graphs();
    }
  }
}

jit::Module scripted_sketch(const Candidate& candidate, const SketchConfig& config, ScriptedLayers& layers) {
  torch::NoGradGuard no_grad;
  const DenseLayer& dense = candidate.layer;
  const bool training = candidate.module.is_training();
  const auto dtype = dense.weight.scalar_type();
  if (dense.kind == LayerKind::attention) {
    const int64_t embed_dim = dense.weight.size(1);
    RandMultiHeadAttention layer(RandMultiHeadAttentionOptions(embed_dim, dense.num_heads, candidate.plan.random_features)
                                     .dropout(dense.dropout)
                                     .bias(dense.bias.defined())
                                     .kernel(config.attention_kernel()));
    const auto in_proj = dense.weight.chunk(3);  // query, key, value, as MHA splits it
    layer->Wq.copy_(in_proj[0]);
    layer->Wk.copy_(in_proj[1]);
    layer->Wv.copy_(in_proj[2]);
    layer->W0.copy_(dense.out_weight);
    if (dense.bias.defined()) {
      const auto in_bias = dense.bias.chunk(3);
      layer->bq.copy_(in_bias[0]);
      layer->bk.copy_(in_bias[1]);
      layer->bv.copy_(in_bias[2]);
      layer->b0.copy_(dense.out_bias);
    }
    layer->to(dtype);
    return layers.make(*layer, dense.batch_first, training);
  }
  if (dense.kind == LayerKind::linear) {
    SKLinear layer(SKLinearOptions(dense.weight.size(1), dense.weight.size(0))
                       .terms(candidate.plan.terms).rank(candidate.plan.rank).bias(dense.bias.defined()),
                   dense.weight);
    if (dense.bias.defined()) layer->bias.copy_(dense.bias);
    layer->to(dtype);
    return layers.make(*layer, training);
  }
  SKConv2d layer(SKConv2dOptions(dense.weight.size(1), dense.weight.size(0), {dense.weight.size(2), dense.weight.size(3)})
                     .stride({dense.stride[0], dense.stride[1]})
                     .padding({dense.padding[0], dense.padding[1]})
                     .terms(candidate.plan.terms).rank(candidate.plan.rank).bias(dense.bias.defined()),
                 dense.weight);
  if (dense.bias.defined()) layer->bias.copy_(dense.bias);
  layer->to(dtype);
  return layers.make(*layer, training);
}

// Its parameters train where the dense layer's weight did: Python fine-tunes the file as it would
// have the dense one, and a frozen layer stays frozen.
jit::Module sketched_module(const Candidate& candidate, const SketchConfig& config, ScriptedLayers& layers) {
  jit::Module sketched = scripted_sketch(candidate, config, layers);
  for (torch::Tensor parameter : sketched.parameters()) parameter.requires_grad_(candidate.layer.weight.requires_grad());
  return sketched;
}

// Layers whose parents share a TorchScript class must all change class or none.
using Group = std::vector<Candidate*>;

void keep_group(Group& group, const std::string& reason) {
  for (Candidate* c : group) {
    if (c->plan.replaced()) c->plan.keep(reason);
  }
}

void replace_group(jit::Module& model, Group& group, const SketchConfig& config, ScriptedLayers& layers) {
  const Candidate& first = *group.front();
  std::vector<jit::Module> sketched;
  for (Candidate* c : group) sketched.push_back(sketched_module(*c, config, layers));
  for (const jit::Module& m : sketched) {
    if (m.type() != sketched.front().type()) {
      keep_group(group, "layers sharing its TorchScript class sketch to different classes");
      return;
    }
  }
  const c10::ClassTypePtr& sketched_type = sketched.front().type();
  first.parent.type()->unsafeChangeAttributeType(first.attribute, sketched_type);
  for (size_t i = 0; i < group.size(); ++i) group[i]->parent._ivalue()->setAttr(first.attribute, sketched[i]._ivalue());
  for_each_read(model, first.parent.type(), first.attribute,
                [&](jit::Node* read, const jit::Function&) { read->output()->setType(sketched_type); });
}

int64_t trainable_parameters(const jit::Module& model) {
  int64_t count = 0;
  for (const torch::Tensor& p : model.parameters()) count += p.numel();
  return count;
}

void check_reloads(const jit::Module& model) {
  std::stringstream buffer;
  try {
    model.save(buffer);
    jit::load(buffer);
  } catch (const std::exception& e) {
    throw Error("sketch: the sketched model does not reload (" + first_line(e) + ")");
  }
}

}  // namespace

jit::Module script_layer(const SKLinearImpl& layer, const std::shared_ptr<jit::CompilationUnit>& unit) {
  return ScriptedLayers(unit).make(layer, layer.is_training());
}

jit::Module script_layer(const SKConv2dImpl& layer, const std::shared_ptr<jit::CompilationUnit>& unit) {
  return ScriptedLayers(unit).make(layer, layer.is_training());
}

jit::Module script_layer(const RandMultiHeadAttentionImpl& layer, const std::shared_ptr<jit::CompilationUnit>& unit) {
  return ScriptedLayers(unit).make(layer, /*batch_first=*/true, layer.is_training(), /*native=*/true);
}

SketchReport sketch_script(jit::Module& model, const SketchConfig& config) {
  check_config(config);
  SketchReport report;
  report.params_before = trainable_parameters(model);
  std::vector<Candidate> candidates;
  find_candidates(model, "", config, candidates);
  if (std::any_of(candidates.begin(), candidates.end(), [](const Candidate& c) { return c.plan.replaced(); })) {
    remove_fast_paths_of_transformers(model);  // they read the layers' weights: attention's, linear1's, ...
  }

  std::map<std::pair<const c10::ClassType*, std::string>, Group> groups;
  for (Candidate& c : candidates) groups[{c.parent.type().get(), c.attribute}].push_back(&c);
  ScriptedLayers layers(model._ivalue()->compilation_unit());
  for (auto& [key, group] : groups) {
    auto kept = std::find_if(group.begin(), group.end(), [](const Candidate* c) { return !c->plan.replaced(); });
    if (kept != group.end()) {
      keep_group(group, fmt::format("it shares its TorchScript class with {}, which is kept", (*kept)->plan.name));
      continue;
    }
    if (std::string use = other_use(model, *group.front()); !use.empty()) {
      keep_group(group, use);
      continue;
    }
    replace_group(model, group, config, layers);
  }
  for (Candidate& c : candidates) report.layers.push_back(std::move(c.plan));
  report.params_after = trainable_parameters(model);
  if (report.replaced_count() > 0) check_reloads(model);
  return report;
}

}  // namespace afterburner::sketch
