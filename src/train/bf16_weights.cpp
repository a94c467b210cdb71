#include "afterburner/train/bf16_weights.h"

#include <torch/csrc/jit/ir/ir.h>

#include <fmt/format.h>

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace afterburner::train {
namespace {

namespace jit = torch::jit;

// The arguments bf16 autocast casts to bf16: LibTorch's lower-precision list for the CPU (its
// AutocastCPU kernels; aten::_convolution, which a trace records, is not on it), and
// afterburner's fused ops, which cast their arguments as the ops they replace.
bool cast_to_bf16(const jit::Use& use) {
  static const std::map<std::string, std::set<size_t>> kCastArguments{
      {"aten::linear", {1, 2}},       {"aten::conv1d", {1, 2}},           {"aten::conv2d", {1, 2}},
      {"aten::conv3d", {1, 2}},       {"aten::matmul", {0, 1}},           {"aten::mm", {0, 1}},
      {"aten::bmm", {0, 1}},          {"aten::addmm", {0, 1, 2}},         {"afterburner::linear_relu", {1, 2}},
      {"afterburner::conv2d", {1, 2}}, {"afterburner::conv2d_relu", {1, 2}}};
  const auto entry = kCastArguments.find(use.user->kind().toQualString());
  return entry != kCastArguments.end() && entry->second.count(use.offset) != 0;
}

bool inside_loop(const jit::Node* node) {
  for (const jit::Block* block = node->owningBlock(); block->owningNode() != nullptr;
       block = block->owningNode()->owningBlock()) {
    if (block->owningNode()->kind() == c10::prim::Loop) return true;
  }
  return false;
}

std::string dotted(const std::vector<std::string>& path) { return fmt::format("{}", fmt::join(path, ".")); }

// How a forward graph reads the attributes of its module (input 0): per dotted path of a tensor
// attribute, its reads; and the modules it hands to anything but prim::GetAttr (a method call,
// a function, prim::SetAttr), whose attributes it may read or write unseen.
struct AttributeReads {
  std::map<std::vector<std::string>, std::vector<jit::Use>> tensors;  // by path, so in one order
  std::vector<std::string> escaped;  // dotted paths of modules; "" is the model itself
};

void collect_reads(const jit::Block* block, std::unordered_map<const jit::Value*, std::vector<std::string>>& paths) {
  for (const jit::Node* node : block->nodes()) {
    if (node->kind() == c10::prim::GetAttr) {
      const auto owner = paths.find(node->input());
      if (owner != paths.end()) {
        std::vector<std::string> path = owner->second;
        path.push_back(node->s(c10::attr::name));
        paths[node->output()] = std::move(path);
      }
    }
    for (const jit::Block* inner : node->blocks()) collect_reads(inner, paths);
  }
}

AttributeReads attribute_reads(const jit::Graph& graph) {
  std::unordered_map<const jit::Value*, std::vector<std::string>> paths{{graph.inputs().at(0), {}}};
  collect_reads(graph.block(), paths);
  AttributeReads reads;
  for (const auto& [value, path] : paths) {
    const bool is_module = value->type()->cast<c10::ClassType>() != nullptr;
    for (const jit::Use& use : value->uses()) {
      if (is_module && use.user->kind() == c10::prim::GetAttr) continue;
      if (is_module) {
        reads.escaped.push_back(dotted(path));
      } else {
        reads.tensors[path].push_back(use);
      }
    }
  }
  return reads;
}

bool under(const std::string& path, const std::vector<std::string>& modules) {
  for (const std::string& module : modules) {
    if (module.empty() || path.rfind(module + ".", 0) == 0) return true;
  }
  return false;
}

// A parameter the forward reads, with every slot it reads it from and every read.
struct Candidate {
  torch::Tensor parameter;
  std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, size_t>> slots;  // (owner, slot index)
  std::vector<jit::Use> uses;
  std::string name;  // the first of its paths
};

// The parameters `reads` reads outside escaped modules, in the order of their paths. A weight tied
// between layers is one candidate with several slots.
std::vector<Candidate> read_parameters(const torch::jit::Module& script, const AttributeReads& reads) {
  std::vector<Candidate> candidates;
  std::unordered_map<const c10::TensorImpl*, size_t> index_of;
  for (const auto& [names, uses] : reads.tensors) {
    const std::string path = dotted(names);
    if (under(path, reads.escaped)) continue;
    c10::intrusive_ptr<c10::ivalue::Object> owner = script._ivalue();
    for (size_t i = 0; i + 1 < names.size(); ++i) owner = owner->getAttr(names[i]).toObject();
    const auto slot = owner->type()->findAttributeSlot(names.back());
    if (!slot || !owner->type()->is_parameter(*slot) || !owner->getSlot(*slot).isTensor()) continue;
    const torch::Tensor parameter = owner->getSlot(*slot).toTensor();
    const auto [entry, added] = index_of.emplace(parameter.unsafeGetTensorImpl(), candidates.size());
    if (added) candidates.push_back({parameter, {}, {}, path});
    Candidate& candidate = candidates[entry->second];
    candidate.slots.emplace_back(owner, *slot);
    candidate.uses.insert(candidate.uses.end(), uses.begin(), uses.end());
  }
  return candidates;
}

}  // namespace

Bf16Weights::Bf16Weights(Model& model, kernels::FlatOptimizer& optimizer) : optimizer_(optimizer) {
  const std::shared_ptr<jit::Graph> graph = model.forward_graph();
  if (!graph) return;
  const AttributeReads reads = attribute_reads(*graph);
  // An escaped module may read a weight tied to one outside it: such weights stay as they are.
  std::unordered_set<const c10::TensorImpl*> escaped;
  for (const auto& parameter : model.script()->named_parameters()) {
    if (under(parameter.name, reads.escaped)) escaped.insert(parameter.value.unsafeGetTensorImpl());
  }
  for (const Candidate& candidate : read_parameters(*model.script(), reads)) {
    const torch::Tensor& parameter = candidate.parameter;
    const jit::Use& use = candidate.uses.front();
    if (candidate.uses.size() != 1 || !cast_to_bf16(use) || inside_loop(use.user) ||
        escaped.count(parameter.unsafeGetTensorImpl()) != 0 || !parameter.requires_grad() ||
        parameter.scalar_type() != torch::kFloat) {
      continue;
    }
    const torch::Tensor copy = optimizer_.bf16_copy(parameter);
    for (const auto& [owner, index] : candidate.slots) slots_.push_back({owner, index, parameter, copy});
    names_.push_back(candidate.name);
    copies_.push_back(copy);
  }
}

Bf16Weights::InForward::InForward(Bf16Weights& weights) : weights_(weights) {
  weights_.optimizer_.refresh_bf16_copies();
  for (Slot& slot : weights_.slots_) slot.owner->setSlot(slot.index, slot.copy);
}

Bf16Weights::InForward::~InForward() {
  for (Slot& slot : weights_.slots_) slot.owner->setSlot(slot.index, slot.parameter);
}

}  // namespace afterburner::train
