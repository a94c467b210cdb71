// Reading constants of TorchScript graphs and replacing nodes, for the inference rewrites.
// Internal to src/infer.
#pragma once

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace afterburner::infer {

// A constant list of two integers: a convolution's stride, padding or dilation (not conv2d's
// other overload's padding string).
inline std::optional<std::vector<int64_t>> constant_int_pair(torch::jit::Value* value) {
  const auto constant = torch::jit::toIValue(value);
  if (!constant || !constant->isIntList() || constant->toIntList().size() != 2) return std::nullopt;
  return constant->toIntList().vec();
}

// Replaces `node` by a call of `op` on `inputs`, inserted where the node was, whose outputs (as
// many, of the same types) take the places of the node's.
inline void replace_by_call(torch::jit::Node* node, const char* op, at::ArrayRef<torch::jit::Value*> inputs) {
  torch::jit::Node* call =
      node->owningGraph()->create(c10::Symbol::fromQualString(op), inputs, node->outputs().size());
  call->insertBefore(node);
  for (size_t i = 0; i < node->outputs().size(); ++i) call->output(i)->setType(node->output(i)->type());
  node->replaceAllUsesWith(call);
  node->destroy();
}

// As replace_by_call, for an `op` that returns a float after the node's outputs (a bound of its
// tensor output's values): returns the call, whose last output nothing reads yet.
inline torch::jit::Node* replace_by_bounded_call(torch::jit::Node* node, const char* op,
                                                 at::ArrayRef<torch::jit::Value*> inputs) {
  torch::jit::Node* call =
      node->owningGraph()->create(c10::Symbol::fromQualString(op), inputs, node->outputs().size() + 1);
  call->insertBefore(node);
  for (size_t i = 0; i < node->outputs().size(); ++i) {
    call->output(i)->setType(node->output(i)->type());
    node->output(i)->replaceAllUsesWith(call->output(i));
  }
  call->outputs().back()->setType(c10::FloatType::get());
  node->destroy();
  return call;
}

// How many nodes of `block`, and of the blocks inside its nodes, are of one of `kinds`.
inline int count_nodes(const torch::jit::Block* block, const std::vector<std::string>& kinds) {
  int count = 0;
  for (const torch::jit::Node* node : block->nodes()) {
    count += std::find(kinds.begin(), kinds.end(), node->kind().toQualString()) != kinds.end();
    for (const torch::jit::Block* inner : node->blocks()) count += count_nodes(inner, kinds);
  }
  return count;
}

}  // namespace afterburner::infer
