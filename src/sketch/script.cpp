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
#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::sketch {
namespace jit = torch::jit;
namespace {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

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
    return torch.matmul(torch.matmul(x, first), second){bias}
)";

// U1s [2L, k, C_out] becomes the weight [C_out, 2Lk, 1, 1] of a 1x1 convolution mixing the
// 2Lk sketched channels, channel i k + kappa holding term i's kappa-th filter.
const char* const kConvForward = R"(
def forward(self, x):
    sketched = torch.conv2d(x, self.S1s, None, [{stride}], [{padding}])
    mix = self.U1s.reshape([-1, self.U1s.size(2)]).t().unsqueeze(2).unsqueeze(3)
    return torch.conv2d(sketched, mix * (1.0 / self.U1s.size(0)), {bias})
)";

// Sketched layers as TorchScript modules: one class per distinct forward source.
class ScriptedLayers {
 public:
  explicit ScriptedLayers(std::shared_ptr<jit::CompilationUnit> unit) : unit_(std::move(unit)) {}

  jit::Module make(const std::string& kind, const std::string& source, const NamedTensors& parameters,
                   const NamedTensors& buffers, bool training) {
    auto known = classes_.find(source);
    jit::Module out = known != classes_.end()
                          ? jit::Module(unit_, known->second)
                          : jit::Module(c10::QualifiedName("__torch__.afterburner.sketch." + kind), unit_, true);
    for (const auto& [name, tensor] : parameters) out.register_parameter(name, tensor.detach().clone(), false);
    for (const auto& [name, tensor] : buffers) out.register_buffer(name, tensor.detach().clone());
    if (known == classes_.end()) {
      out.define(source);
      classes_.emplace(source, out.type());
    }
    out.train(training);
    return out;
  }

  jit::Module make(const SKLinearImpl& layer, bool training) {
    NamedTensors parameters{{"S1s", layer.S1s}, {"S2s", layer.S2s}};
    if (layer.bias.defined()) parameters.emplace_back("bias", layer.bias);
    const std::string source = fmt::format(kLinearForward, fmt::arg("bias", layer.bias.defined() ? " + self.bias" : ""));
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

 private:
  std::shared_ptr<jit::CompilationUnit> unit_;
  std::map<std::string, c10::ClassTypePtr> classes_;
};

// A submodule whose forward is one linear or 2-D convolution of its own weight and bias.
struct DenseLayer {
  LayerKind kind = LayerKind::linear;
  torch::Tensor weight, bias;             // bias undefined when the layer has none
  std::vector<int64_t> stride, padding;   // conv2d only
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
    auto layer = as_dense_layer(child.value);
    if (!layer) {
      find_candidates(child.value, path, config, out);
      continue;
    }
    const std::vector<int64_t> shape = layer->weight.sizes().vec();
    const bool has_bias = layer->bias.defined();
    LayerPlan plan = layer->unsupported.empty() ? plan_layer(config, path, layer->kind, shape, has_bias)
                                                : keep_layer(path, layer->kind, shape, has_bias, layer->unsupported);
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

// Why the layer's module cannot change class: some code does more than call its forward.
std::string other_use(const jit::Module& model, const Candidate& candidate) {
  std::string use;
  for_each_read(model, candidate.parent.type(), candidate.attribute, [&](jit::Node* read, const jit::Function& in) {
    for (const jit::Use& u : read->output()->uses()) {
      const bool calls_forward = u.user->kind() == c10::prim::CallMethod && u.offset == 0 &&
                                 u.user->s(c10::attr::name) == "forward";
      if (!calls_forward && use.empty()) use = fmt::format("{} uses the module other than by calling it", in.name());
    }
  });
  return use;
}

jit::Module sketched_module(const Candidate& candidate, const SketchConfig& config, ScriptedLayers& layers) {
  torch::NoGradGuard no_grad;
  const DenseLayer& dense = candidate.layer;
  const bool training = candidate.module.is_training();
  const auto dtype = dense.weight.scalar_type();
  if (dense.kind == LayerKind::linear) {
    SKLinear layer(SKLinearOptions(dense.weight.size(1), dense.weight.size(0))
                       .terms(config.terms()).rank(candidate.plan.rank).bias(dense.bias.defined()),
                   dense.weight);
    if (dense.bias.defined()) layer->bias.copy_(dense.bias);
    layer->to(dtype);
    return layers.make(*layer, training);
  }
  SKConv2d layer(SKConv2dOptions(dense.weight.size(1), dense.weight.size(0), {dense.weight.size(2), dense.weight.size(3)})
                     .stride({dense.stride[0], dense.stride[1]})
                     .padding({dense.padding[0], dense.padding[1]})
                     .terms(config.terms()).rank(candidate.plan.rank).bias(dense.bias.defined()),
                 dense.weight);
  if (dense.bias.defined()) layer->bias.copy_(dense.bias);
  layer->to(dtype);
  return layers.make(*layer, training);
}

// Layers whose parents share a TorchScript class must all change class or none.
using Group = std::vector<Candidate*>;

void keep_group(Group& group, const std::string& reason) {
  for (Candidate* c : group) {
    if (c->plan.replaced()) {
      c->plan = keep_layer(c->plan.name, c->plan.kind, c->plan.weight_shape, c->layer.bias.defined(), reason);
    }
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

SketchReport sketch_script(jit::Module& model, const SketchConfig& config) {
  check_config(config);
  SketchReport report;
  report.params_before = trainable_parameters(model);
  std::vector<Candidate> candidates;
  find_candidates(model, "", config, candidates);

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
