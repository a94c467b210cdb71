#include "afterburner/infer/channel_concat.h"

#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace afterburner::infer {
namespace {

namespace jit = torch::jit;

bool is_channel_concatenation(const jit::Use& use) {
  if (use.user->kind() != c10::aten::cat || use.offset != 0) return false;
  const auto dim = jit::constant_as<int64_t>(use.user->input(1));
  return dim && *dim == 1;
}

// Whether `features` is only a dense copy of a oneDNN tensor, made for the list.
bool converted_for_the_list(const jit::Value* features) {
  const jit::Node* producer = features->node();
  if (producer->kind() != c10::aten::to_dense || features->uses().size() != 1) return false;
  const auto dtype = jit::toIValue(producer->input(1));
  return dtype && dtype->isNone();
}

// The users of `list` (a prim::ListConstruct's) in program order, if it is only appended to
// (features converted from oneDNN's layout, the list returned unused) and concatenated along
// channels, all in the graph's top block, and holds a tensor at its first concatenation; none
// otherwise. (bf16 graphs append channels-last features, whose layout at::cat keeps for the
// convolutions reading them: measured slower through a buffer.)
std::vector<jit::Node*> grown_and_concatenated(const jit::Node* list) {
  std::vector<jit::Node*> users;
  for (const jit::Use& use : list->output()->uses()) {
    const bool appended = use.user->kind() == c10::aten::append && use.offset == 0 &&
                          !use.user->output()->hasUses() && converted_for_the_list(use.user->input(1));
    if (use.user->owningBlock() != list->owningBlock() || (!appended && !is_channel_concatenation(use))) return {};
    users.push_back(use.user);
  }
  std::sort(users.begin(), users.end(), [](const jit::Node* a, const jit::Node* b) { return a->isBefore(b); });
  const auto first_concatenation = std::find_if(users.begin(), users.end(),
                                                [](const jit::Node* user) { return user->kind() == c10::aten::cat; });
  if (first_concatenation == users.end()) return {};
  if (list->inputs().empty() && first_concatenation == users.begin()) return {};
  return users;
}

// The channels of `converted` (a to_dense of a oneDNN tensor) where its producer tells: a oneDNN
// convolution of optimize_for_inference's packed weight (a constant of a kind of its own); 0 where
// it does not.
int64_t known_channels(const jit::Value* converted) {
  const jit::Node* producer = converted->node()->input(0)->node();
  static const std::vector<c10::Symbol> convolutions{c10::Symbol::fromQualString("prim::mkldnn_convolution"),
                                                     c10::Symbol::fromQualString("afterburner::conv2d_winograd"),
                                                     c10::Symbol::fromQualString("afterburner::conv2d_activation")};
  if (std::find(convolutions.begin(), convolutions.end(), producer->kind()) == convolutions.end()) return 0;
  const jit::Node* weight = producer->input(1)->node();
  if (weight->kind() != c10::Symbol::fromQualString("prim::ConstantMKLDNNTensor")) return 0;
  return weight->t(c10::attr::value).size(0);
}

// Replaces the list's appends and concatenations (`users`, in program order) by the growing
// buffer's ops.
void grow_buffer_of(jit::Graph& graph, jit::Node* list, const std::vector<jit::Node*>& users) {
  std::vector<jit::Value*> pending(list->inputs().begin(), list->inputs().end());
  std::vector<jit::Node*> conversions;  // to_dense of appended tensors, left without a use
  jit::Value* held = nullptr;
  for (size_t i = 0; i < users.size(); ++i) {
    jit::Node* user = users[i];
    if (user->kind() == c10::aten::append) {  // the oneDNN tensor itself: reordered straight into place
      conversions.push_back(user->input(1)->node());
      pending.push_back(user->input(1)->node()->input(0));
      continue;
    }
    if (pending.empty()) {  // concatenated again with nothing appended: the same tensor
      user->output()->replaceAllUsesWith(held);
      continue;
    }
    int64_t spare = 0;
    for (size_t later = i + 1; later < users.size(); ++later) {
      if (users[later]->kind() == c10::aten::append) spare += known_channels(users[later]->input(1));
    }
    const jit::WithInsertPoint point(user);
    jit::Value* items = graph.insertNode(graph.createList(c10::TensorType::get(), pending))->output();
    jit::Value* room = graph.insertConstant(spare);
    held = held ? graph.insert(c10::Symbol::fromQualString("afterburner::concat_append"), {held, items, room})
                : graph.insert(c10::Symbol::fromQualString("afterburner::concat_reserve"), {items, room});
    held->setType(user->output()->type());
    user->output()->replaceAllUsesWith(held);
    pending.clear();
  }
  for (auto user = users.rbegin(); user != users.rend(); ++user) (*user)->destroy();
  list->destroy();
  for (jit::Node* conversion : conversions) conversion->destroy();
}

}  // namespace

int concatenate_into_growing_buffers(std::shared_ptr<jit::Graph>& graph) {
  std::vector<std::pair<jit::Node*, std::vector<jit::Node*>>> lists;
  for (jit::Node* node : graph->nodes()) {
    if (node->kind() != c10::prim::ListConstruct) continue;
    auto users = grown_and_concatenated(node);
    if (!users.empty()) lists.emplace_back(node, std::move(users));
  }
  for (const auto& [list, users] : lists) grow_buffer_of(*graph, list, users);
  return static_cast<int>(lists.size());
}

}  // namespace afterburner::infer
