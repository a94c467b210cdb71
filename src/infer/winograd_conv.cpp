#include "afterburner/infer/winograd_conv.h"

#include <ATen/Parallel.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "graph_edits.h"
#include "winograd_weights.h"

namespace afterburner::infer {

namespace {

namespace jit = torch::jit;

// Scratch memory for oneDNN's Winograd kernels (the transformed images: tens of MB at batch 32),
// one buffer per calling thread, grown as needed and kept: memory freshly mapped per call costs a
// page fault per 4 KB, which made each call 5 times slower than its arithmetic.
ideep::tensor scratchpad(const ideep::tensor::desc& desc) {
  thread_local at::Tensor buffer;
  const int64_t bytes = static_cast<int64_t>(desc.get_size());
  if (!buffer.defined() || buffer.numel() < bytes) buffer = at::empty({bytes}, at::kByte);
  return ideep::tensor(desc, buffer.data_ptr());
}

// The largest magnitude's bits among `count` fp32 values (sign cleared), compiled per instruction set.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) uint32_t largest_magnitude_bits(
    const uint32_t* bits, int64_t count) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < count; ++i) largest = std::max(largest, bits[i] & 0x7fffffffu);
  return largest;
}

// afterburner::conv2d_winograd: the convolution by Winograd's algorithm where it pays and gives
// finite values (see convolve_on_onednn).
at::Tensor conv2d_winograd(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                           std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                           int64_t groups, const c10::intrusive_ptr<WinogradWeights>& winograd) {
  return convolve_on_onednn(x, weight, bias, stride, padding, dilation, groups, winograd);
}

// The dense fp32 weight of a convolution Winograd's kernels take (see convolve_3x3_by_winograd).
std::optional<at::Tensor> winograd_weight(const jit::Node* conv) {
  const jit::Node* constant = conv->input(1)->node();
  if (constant->kind() != c10::Symbol::fromQualString("prim::ConstantMKLDNNTensor")) return std::nullopt;
  const at::Tensor weight = constant->t(c10::attr::value);
  const auto stride = constant_int_pair(conv->input(3)), padding = constant_int_pair(conv->input(4)),
             dilation = constant_int_pair(conv->input(5));
  const auto groups = jit::constant_as<int64_t>(conv->input(6));
  const auto at_most_one = [](int64_t pad) { return pad == 0 || pad == 1; };
  if (weight.dim() != 4 || weight.scalar_type() != at::kFloat || weight.size(2) != 3 || weight.size(3) != 3 ||
      weight.size(0) % 16 != 0 || weight.size(1) % 16 != 0 || stride != std::vector<int64_t>{1, 1} ||
      dilation != std::vector<int64_t>{1, 1} || groups != 1 || !padding || !at_most_one((*padding)[0]) ||
      !at_most_one((*padding)[1])) {
    return std::nullopt;
  }
  return weight.to_dense().contiguous();
}

}  // namespace

float largest_magnitude(const ideep::tensor& buffer) {
  const auto* bits = static_cast<const uint32_t*>(buffer.get_data_handle());
  const int64_t count = static_cast<int64_t>(buffer.get_size() / sizeof(float));
  const uint32_t largest = at::parallel_reduce(
      0, count, 1 << 16, uint32_t{0},
      [&](int64_t begin, int64_t end, uint32_t partial) {
        return std::max(partial, largest_magnitude_bits(bits + begin, end - begin));
      },
      [](uint32_t a, uint32_t b) { return std::max(a, b); });
  if (largest >= 0x7f800000u) return std::numeric_limits<float>::infinity();  // NaN's bits are above infinity's
  float magnitude;
  std::memcpy(&magnitude, &largest, sizeof magnitude);
  return magnitude;
}

std::optional<at::Tensor> winograd_convolution(const at::Tensor& x, WinogradWeights& weights,
                                               const c10::optional<at::Tensor>& bias,
                                               const std::vector<int64_t>& padding, const ideep::attr_t& attr) {
  const ideep::tensor& dense = weights.dense();
  const int64_t out_channels = dense.get_dim(0);
  if (!x.is_mkldnn() || x.dim() != 4 || x.scalar_type() != at::kFloat || x.size(1) != dense.get_dim(1)) {
    return std::nullopt;
  }
  const int64_t batch = x.size(0);
  const int64_t height = x.size(2) + 2 * padding[0] - 2, width = x.size(3) + 2 * padding[1] - 2;
  if (height <= 0 || width <= 0 || !winograd_pays(batch, height, width, x.size(1), out_channels)) return std::nullopt;
  const ideep::tensor& src = ideep_tensor(x);
  const ideep::tensor no_bias;
  const ideep::tensor& bias_tensor = bias && bias->defined() ? ideep_tensor(*bias) : no_bias;
  ideep::tensor dst;
  ideep::convolution_forward_params params;
  try {
    ideep::convolution_forward::prepare(params, src, dense, bias_tensor, {batch, out_channels, height, width}, dst,
                                        {1, 1}, {1, 1}, padding, padding, 1, ideep::scale_t(), ideep::scale_t(),
                                        ideep::scale_t(), attr, ideep::algorithm::convolution_winograd,
                                        ideep::prop_kind::forward_inference);
  } catch (const std::exception&) {  // no Winograd kernel for this geometry on this CPU
    return std::nullopt;
  }
  params.scratchpad = scratchpad(params.pd.scratchpad_desc());
  ideep::convolution_forward::compute(params, src, weights.in_layout(params.pd.weights_desc()), bias_tensor, dst);
  return onednn_tensor(std::move(dst));
}

at::Tensor convolve_on_onednn(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                              const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                              const std::vector<int64_t>& dilation, int64_t groups,
                              const c10::intrusive_ptr<WinogradWeights>& winograd) {
  const at::AutoDispatchBelowAutograd below_autograd;
  if (winograd) {
    const auto y = winograd_convolution(x, *winograd, bias, padding, ideep::attr_t());
    if (y && largest_magnitude(ideep_tensor(*y)) < std::numeric_limits<float>::infinity()) return *y;
  }
  return at::mkldnn_convolution(x, weight, bias, padding, stride, dilation, groups);
}

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  register_winograd_weights_class();
  m.def("conv2d_winograd(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
        "int groups, __torch__.torch.classes.afterburner.WinogradWeights winograd) -> Tensor",
        conv2d_winograd);
}

// Measured on an AMD EPYC (AVX-512, 2 threads), oneDNN 2.6: Winograd took 0.3-0.8x the direct
// convolution's time from 14x14 outputs up and for batches of 8 at 7x7 where the channels are
// many, and up to 2.5x it below that work (7x7 outputs of 64 channels; batches of 3 to 6 at 7x7).
bool winograd_pays(int64_t batch, int64_t height, int64_t width, int64_t channels, int64_t out_channels) {
  const int64_t pixels = height * width;
  return (pixels >= 14 * 14 || batch >= 8) && batch * pixels * channels * out_channels >= (int64_t{1} << 23);
}

int convolve_3x3_by_winograd(std::shared_ptr<jit::Graph>& graph) {
  const c10::Symbol mkldnn_convolution = c10::Symbol::fromQualString("prim::mkldnn_convolution");
  std::vector<jit::Node*> convolutions;
  for (jit::Node* node : graph->nodes()) {
    if (node->kind() == mkldnn_convolution) convolutions.push_back(node);
  }
  int rewritten = 0;
  for (jit::Node* conv : convolutions) {
    const auto weight = winograd_weight(conv);
    if (!weight) continue;
    jit::WithInsertPoint insert_point(conv);
    jit::Value* weights = graph->insertConstant(c10::IValue(c10::make_intrusive<WinogradWeights>(*weight)));
    std::vector<jit::Value*> inputs = conv->inputs().vec();
    inputs.push_back(weights);
    replace_by_call(conv, "afterburner::conv2d_winograd", inputs);
    ++rewritten;
  }
  return rewritten;
}

}  // namespace afterburner::infer
