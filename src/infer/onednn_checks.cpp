#include "afterburner/infer/onednn_checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ATen/ATen.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "graph_edits.h"

namespace afterburner::infer {
namespace {

using torch::jit::Node;

std::string int_list(c10::IntArrayRef values) { return fmt::format("[{}]", fmt::join(values, ", ")); }

Error unsupported(const Node* node, const std::string& what, const std::string& rule) {
  return Error(fmt::format("infer: {} with {} is not supported: {}", node->kind().toQualString(), what, rule));
}

// "2", "1 or 2", "0, 1 or 2"
std::string alternatives(const std::vector<size_t>& lengths) {
  const std::vector<size_t> all_but_last(lengths.begin(), lengths.end() - 1);
  return all_but_last.empty() ? std::to_string(lengths.back())
                              : fmt::format("{} or {}", fmt::join(all_but_last, ", "), lengths.back());
}

// The node's constant int list `name`, with one of `lengths` and each value at least `minimum`;
// nothing when it is not a constant list (a padding of 'same'), which the conversion leaves.
std::optional<std::vector<int64_t>> checked_list(const Node* node, const char* name,
                                                 const std::vector<size_t>& lengths, int64_t minimum) {
  const auto value = torch::jit::toIValue(node->namedInput(name));
  if (!value || !value->isIntList()) return std::nullopt;
  const std::vector<int64_t> values = value->toIntVector();
  const std::string what = fmt::format("{} {}", name, int_list(values));
  if (std::find(lengths.begin(), lengths.end(), values.size()) == lengths.end()) {
    const bool one = lengths == std::vector<size_t>{1};
    throw unsupported(node, what, fmt::format("{} must have {} value{}", name, alternatives(lengths), one ? "" : "s"));
  }
  for (int64_t v : values) {
    if (v < minimum) throw unsupported(node, what, fmt::format("{} must be at least {}", name, minimum));
  }
  return values;
}

void check_groups(const Node* convolution, const torch::Tensor& weight) {
  const auto groups = torch::jit::toIValue(convolution->namedInput("groups"));
  if (!groups || !groups->isInt()) return;
  const int64_t g = groups->toInt();
  if (g >= 1 && (weight.dim() == 0 || weight.size(0) % g == 0)) return;
  const std::string rule = fmt::format("groups must be at least 1 and divide the weight's {} output channels",
                                       weight.size(0));
  throw unsupported(convolution, fmt::format("groups {}", g), rule);
}

// Eager's rules: a 4-D weight for conv2d (5-D for conv3d), a bias of one value per output
// channel, one stride, padding and dilation per spatial dimension, groups dividing the channels.
void check_convolution(const Node* convolution, const torch::Tensor& weight) {
  const bool conv2d = convolution->kind() == c10::aten::conv2d, conv3d = convolution->kind() == c10::aten::conv3d;
  if ((conv2d && weight.dim() != 4) || (conv3d && weight.dim() != 5)) {
    throw unsupported(convolution, fmt::format("a weight of shape {}", int_list(weight.sizes())),
                      fmt::format("its weight must have {} dimensions", conv2d ? 4 : 5));
  }
  // The weight's layout replaces the weight value in all the node's inputs, then converts the
  // bias from its constant: a bias reading the weight itself was no constant any more (SIGSEGV).
  const auto bias = torch::jit::toIValue(convolution->namedInput("bias"));
  if (bias && bias->isTensor() && weight.dim() > 0 &&
      (bias->toTensor().dim() != 1 || bias->toTensor().size(0) != weight.size(0))) {
    throw unsupported(convolution, fmt::format("a bias of shape {}", int_list(bias->toTensor().sizes())),
                      fmt::format("its bias must have one value per output channel, {}", weight.size(0)));
  }
  // A traced aten::_convolution becomes aten::conv2d or conv3d by the length of its lists.
  const std::vector<size_t> spatial{static_cast<size_t>(std::max<int64_t>(weight.dim() - 2, 0))};
  checked_list(convolution, "stride", spatial, 1);
  checked_list(convolution, "dilation", spatial, 1);
  checked_list(convolution, "padding", spatial, 0);
  check_groups(convolution, weight);
}

// Eager's rules: one value or one per spatial dimension (the stride may be empty), a kernel,
// stride and dilation of at least 1 and a padding of at most half the kernel.
void check_max_pool(const Node* pool, size_t spatial) {
  const auto kernel = checked_list(pool, "kernel_size", {1, spatial}, 1);
  checked_list(pool, "stride", {0, 1, spatial}, 1);  // none: the kernel size
  checked_list(pool, "dilation", {1, spatial}, 1);
  const auto padding = checked_list(pool, "padding", {1, spatial}, 0);
  if (!kernel || !padding) return;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t k = (*kernel)[kernel->size() == 1 ? 0 : i], p = (*padding)[padding->size() == 1 ? 0 : i];
    if (p > k / 2) {
      throw unsupported(pool, fmt::format("padding {}", int_list(*padding)),
                        fmt::format("padding must be at most half of kernel_size {}", int_list(*kernel)));
    }
  }
}

// The convolutions with a constant weight (transposed ones stay on ATen) and the max poolings
// of `block` and its nested blocks.
void check_block(const torch::jit::Block* block) {
  for (const Node* node : block->nodes()) {
    for (const torch::jit::Block* inner : node->blocks()) check_block(inner);
    if (!node->maybeSchema()) continue;
    if (node->kind() == c10::aten::max_pool2d || node->kind() == c10::aten::max_pool3d) {
      check_max_pool(node, node->kind() == c10::aten::max_pool2d ? 2 : 3);
      continue;
    }
    if (node->kind() != c10::aten::conv2d && node->kind() != c10::aten::conv3d &&
        node->kind() != c10::aten::_convolution) {
      continue;
    }
    const auto weight = torch::jit::toIValue(node->namedInput("weight"));
    if (!weight || !weight->isTensor()) continue;
    if (node->kind() == c10::aten::_convolution) {
      const auto transposed = torch::jit::toIValue(node->namedInput("transposed"));
      if (!transposed || !transposed->isBool() || transposed->toBool()) continue;
    }
    check_convolution(node, weight->toTensor());
  }
}

}  // namespace

void check_onednn_layouts(const torch::jit::Graph& graph) { check_block(graph.block()); }

namespace {

// Whether `value` is computed from a convolution, linear layer or norm (a floating-point tensor)
// through ops that keep its dtype: the chains optimize_for_inference moves to oneDNN.
bool from_float_layer(const torch::jit::Value* value) {
  static const std::vector<std::string> layers{"aten::conv1d",   "aten::conv2d",     "aten::conv3d",
                                               "aten::_convolution", "aten::linear", "aten::batch_norm",
                                               "aten::layer_norm"};
  static const std::vector<std::string> dtype_keeping{
      "aten::relu",     "aten::relu_",   "aten::hardtanh", "aten::hardtanh_",  "aten::clamp",     "aten::clamp_",
      "aten::add",      "aten::add_",    "aten::mul",      "aten::mul_",       "aten::hardswish", "aten::hardswish_",
      "aten::silu",     "aten::silu_",   "aten::sigmoid",  "aten::tanh",       "aten::gelu",      "aten::max_pool2d",
      "aten::avg_pool2d", "aten::adaptive_avg_pool2d",     "aten::dropout"};
  const auto is_one_of = [](const std::vector<std::string>& kinds, const Node* node) {
    return std::find(kinds.begin(), kinds.end(), node->kind().toQualString()) != kinds.end();
  };
  const Node* node = value->node();
  while (is_one_of(dtype_keeping, node)) node = node->input(0)->node();
  return is_one_of(layers, node);
}

}  // namespace

int clamp_bounds_as_floats(torch::jit::Graph& graph) {
  int rewritten = 0;
  for (Node* node : graph.nodes()) {
    const std::string kind = node->kind().toQualString();
    if ((kind != "aten::clamp" && kind != "aten::clamp_") || node->inputs().size() != 3 ||
        !from_float_layer(node->input(0))) {
      continue;
    }
    const auto lower = torch::jit::toIValue(node->input(1)), upper = torch::jit::toIValue(node->input(2));
    const auto is_bound = [](const std::optional<c10::IValue>& v) { return v && (v->isNone() || v->isScalar()); };
    if (!is_bound(lower) || !is_bound(upper) || (lower->isNone() && upper->isNone()) ||
        (lower->isDouble() && upper->isDouble())) {
      continue;
    }
    const double inf = std::numeric_limits<double>::infinity();
    torch::jit::WithInsertPoint insert_point(node);
    node->replaceInput(1, graph.insertConstant(lower->isNone() ? -inf : lower->toScalar().toDouble()));
    node->replaceInput(2, graph.insertConstant(upper->isNone() ? inf : upper->toScalar().toDouble()));
    ++rewritten;
  }
  return rewritten;
}

namespace {

// ATen's avg_pool2d, on a dense copy of a oneDNN tensor (and the answer in oneDNN's layout again).
at::Tensor avg_pool2d_as_aten(const at::Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                              std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad,
                              c10::optional<int64_t> divisor_override) {
  const auto pool = [&](const at::Tensor& input) {
    return at::avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  };
  return x.is_mkldnn() ? pool(x.to_dense()).to_mkldnn() : pool(x);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.def("avg_pool2d_as_aten(Tensor x, int[] kernel_size, int[] stride, int[] padding, bool ceil_mode, "
        "bool count_include_pad, int? divisor_override) -> Tensor",
        TORCH_FN(avg_pool2d_as_aten));
}

int average_pools_as_aten(torch::jit::Graph& graph) {
  int rewritten = 0;
  std::vector<Node*> pools;
  for (Node* node : graph.nodes()) {
    if (node->kind() != c10::aten::avg_pool2d || node->inputs().size() != 7) continue;
    const auto ceil_mode = torch::jit::constant_as<bool>(node->input(4));
    const auto count_include_pad = torch::jit::constant_as<bool>(node->input(5));
    const auto padding = torch::jit::toIValue(node->input(3));
    const auto divisor = torch::jit::toIValue(node->input(6));
    if (ceil_mode == false || count_include_pad == false) {
      if (!divisor || !divisor->isNone()) pools.push_back(node);
      continue;
    }
    const std::vector<int64_t> pads = padding && padding->isIntList() ? padding->toIntVector() : std::vector<int64_t>{1};
    if (divisor && divisor->isNone() && std::all_of(pads.begin(), pads.end(), [](int64_t v) { return v == 0; })) {
      // Without padding ATen's windows count the pixels they cover either way: count no padding.
      torch::jit::WithInsertPoint insert_point(node);
      node->replaceInput(5, graph.insertConstant(false));
      ++rewritten;
    } else {
      pools.push_back(node);
    }
  }
  for (Node* pool : pools) replace_by_call(pool, "afterburner::avg_pool2d_as_aten", pool->inputs());
  return rewritten + static_cast<int>(pools.size());
}

}  // namespace afterburner::infer
