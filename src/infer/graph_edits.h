// Reading constants of TorchScript graphs and replacing nodes, for the inference rewrites.
// Internal to src/infer.
#pragma once

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace afterburner::infer {

// A constant list of two integers: a convolution's stride, padding or dilation (not conv2d's
// other overload's padding string).
inline std::optional<std::vector<int64_t>> constant_int_pair(torch::jit::Value* value) {
  const auto constant = torch::jit::toIValue(value);
  if (!constant || !constant->isIntList() || constant->toIntList().size() != 2) return std::nullopt;
  return constant->toIntList().vec();
}

// Replaces `node` (one output) by a call of `op` on `inputs`, inserted where the node was.
inline void replace_by_call(torch::jit::Node* node, const char* op, const std::vector<torch::jit::NamedValue>& inputs) {
  torch::jit::Value* replacement = nullptr;
  {
    const torch::jit::WithInsertPoint insert_point(node);  // restored before the node goes
    replacement = node->owningGraph()->insert(c10::Symbol::fromQualString(op), inputs);
  }
  replacement->setType(node->output()->type());
  node->output()->replaceAllUsesWith(replacement);
  node->destroy();
}

}  // namespace afterburner::infer
