#include "afterburner/infer/pool_first.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "afterburner/core/ideep_tensor.h"
#include "conv_bounds.h"
#include "graph_edits.h"
#include "winograd_weights.h"

namespace afterburner::infer {
namespace {

namespace jit = torch::jit;

// avg_pool2d(conv2d(x, weight, bias)) for a 1x1 weight and a pooling without padding:
// sum_c w[o, c] * mean_window(x[c]) + b[o] where max|x| and the sums it bounds (max|x| *
// weight_row_sum + largest_bias) are below kFiniteSums, so that neither order overflows; else, and
// for NaN or infinite inputs, the convolution first (the graph's order and bits). Without padding
// a window counts the pixels it covers whether count_include_pad is set or not (ATen clips windows
// to the input plus its padding): oneDNN's pooling is told not to count padding, because with
// ceil_mode it would count a last window's overhang as padding (see average_pools_as_aten).
at::Tensor avg_pool_pointwise_conv2d(const at::Tensor& x, const at::Tensor& weight,
                                     const c10::optional<at::Tensor>& bias, std::vector<int64_t> kernel_size,
                                     std::vector<int64_t> stride, bool ceil_mode, double weight_row_sum,
                                     double largest_bias) {
  const at::AutoDispatchBelowAutograd below_autograd;
  const std::vector<int64_t> ones{1, 1}, zeros{0, 0};
  const auto convolve = [&](const at::Tensor& input) {
    return convolve_on_onednn(input, weight, bias, ones, zeros, ones, 1, {});
  };
  const auto pool = [&](const at::Tensor& input) {
    return at::avg_pool2d(input, kernel_size, stride, zeros, ceil_mode, /*count_include_pad=*/false, c10::nullopt);
  };
  if (!x.is_mkldnn() || x.scalar_type() != at::kFloat) return pool(convolve(x));
  const double largest = largest_magnitude(ideep_tensor(x));
  const bool finite = largest < kFiniteSums && largest * weight_row_sum + largest_bias < kFiniteSums;
  return finite ? convolve(pool(x)) : pool(convolve(x));
}

// Whether `value` is a constant list of integers, all 0 (a pooling's padding).
bool all_zero(jit::Value* value) {
  const auto constant = jit::toIValue(value);
  if (!constant || !constant->isIntList()) return false;
  const std::vector<int64_t> list = constant->toIntVector();
  return std::all_of(list.begin(), list.end(), [](int64_t v) { return v == 0; });
}

// Whether `conv` (a prim::mkldnn_convolution) convolves each pixel alone: a 1x1 constant weight,
// stride 1, no padding, one group.
bool pointwise(const jit::Node* conv) {
  const jit::Node* weight = conv->input(1)->node();
  if (weight->kind() != c10::Symbol::fromQualString("prim::ConstantMKLDNNTensor")) return false;
  const auto sizes = weight->t(c10::attr::value).sizes();
  return sizes.size() == 4 && sizes[2] == 1 && sizes[3] == 1 &&
         constant_int_pair(conv->input(3)) == std::vector<int64_t>{1, 1} &&
         constant_int_pair(conv->input(4)) == std::vector<int64_t>{0, 0} &&
         jit::constant_as<int64_t>(conv->input(6)) == 1;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.def("avg_pool_pointwise_conv2d(Tensor x, Tensor weight, Tensor? bias, int[] kernel_size, int[] stride, "
        "bool ceil_mode, float weight_row_sum, float largest_bias) -> Tensor",
        avg_pool_pointwise_conv2d);
}

int pool_before_pointwise_convolutions(std::shared_ptr<jit::Graph>& graph) {
  const c10::Symbol mkldnn_convolution = c10::Symbol::fromQualString("prim::mkldnn_convolution");
  std::vector<jit::Node*> pools;
  for (jit::Node* pool : graph->nodes()) {
    if (pool->kind() != c10::aten::avg_pool2d || pool->inputs().size() != 7) continue;
    const jit::Node* conv = pool->input(0)->node();
    const auto divisor = jit::toIValue(pool->input(6));
    if (conv->kind() == mkldnn_convolution && conv->output()->uses().size() == 1 && pointwise(conv) &&
        all_zero(pool->input(3)) && divisor && divisor->isNone()) {
      pools.push_back(pool);
    }
  }
  int rewritten = 0;
  for (jit::Node* pool : pools) {
    jit::Node* conv = pool->input(0)->node();
    const auto bounds = sum_bounds(conv);
    if (!bounds) continue;
    jit::Value *row_sum = nullptr, *largest_bias = nullptr;
    {
      const jit::WithInsertPoint point(pool);
      row_sum = graph->insertConstant(bounds->first);
      largest_bias = graph->insertConstant(bounds->second);
    }
    replace_by_call(pool, "afterburner::avg_pool_pointwise_conv2d",
                    {conv->input(0), conv->input(1), conv->input(2), pool->input(1), pool->input(2), pool->input(4),
                     row_sum, largest_bias});
    conv->destroy();
    ++rewritten;
  }
  return rewritten;
}

}  // namespace afterburner::infer
