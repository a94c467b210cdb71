#include "afterburner/infer/winograd_conv.h"

#include <ATen/Parallel.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "afterburner/core/ideep_tensor.h"
#include "graph_edits.h"

namespace afterburner::infer {

// One convolution's fp32 weights, dense [out, in, 3, 3], and the Winograd transforms of them
// oneDNN has asked for: the transform's layout depends on the images (oneDNN picks F(2x2, 3x3)
// or F(4x4, 3x3) and its blocking per geometry), so each is made at the first call wanting it.
class WinogradWeights : public torch::CustomClassHolder {
 public:
  explicit WinogradWeights(at::Tensor dense)
      : dense_(std::move(dense)),
        view_({dense_.sizes().vec(), ideep::data_type::f32, ideep::format_tag::oihw}, dense_.data_ptr()) {}

  // The weights in `layout`: kept for the first kLayoutsKept layouts, made per call after them
  // (images of ever new sizes), the same values either way.
  ideep::tensor in_layout(const ideep::tensor::desc& layout) {
    const std::lock_guard<std::mutex> guard(lock_);
    for (const ideep::tensor& kept : transformed_) {
      if (kept.get_desc() == layout) return kept;
    }
    ideep::tensor transformed;
    transformed.init(layout);
    transformed.feed_from(view_);
    if (transformed_.size() < kLayoutsKept) transformed_.push_back(transformed);
    return transformed;
  }

  const ideep::tensor& dense() const { return view_; }

 private:
  static constexpr size_t kLayoutsKept = 4;
  at::Tensor dense_;
  ideep::tensor view_;  // dense_'s buffer, as oneDNN reads it
  std::mutex lock_;
  std::vector<ideep::tensor> transformed_;
};

namespace {

namespace jit = torch::jit;

// Whether every value of the buffer is finite: an exponent of all ones is an infinity or NaN.
bool all_finite(const ideep::tensor& buffer) {
  const auto* bits = static_cast<const uint32_t*>(buffer.get_data_handle());
  const int64_t count = static_cast<int64_t>(buffer.get_size() / sizeof(float));
  constexpr uint32_t kExponent = 0x7f800000u;
  return at::parallel_reduce(
      0, count, 1 << 16, true,
      [&](int64_t begin, int64_t end, bool finite) {
        uint32_t largest = 0;
        for (int64_t i = begin; i < end; ++i) largest = std::max(largest, bits[i] & kExponent);
        return finite && largest != kExponent;
      },
      [](bool a, bool b) { return a && b; });
}

// Scratch memory for oneDNN's Winograd kernels (the transformed images: tens of MB at batch 32),
// one buffer per calling thread, grown as needed and kept: memory freshly mapped per call costs a
// page fault per 4 KB, which made each call 5 times slower than its arithmetic.
ideep::tensor scratchpad(const ideep::tensor::desc& desc) {
  thread_local at::Tensor buffer;
  const int64_t bytes = static_cast<int64_t>(desc.get_size());
  if (!buffer.defined() || buffer.numel() < bytes) buffer = at::empty({bytes}, at::kByte);
  return ideep::tensor(desc, buffer.data_ptr());
}

// y = conv2d(x, weight, bias), stride 1, one group, as prim::mkldnn_convolution computes it on
// oneDNN tensors, by oneDNN's Winograd algorithm where it pays and gives finite values, else by
// the direct convolution prim::mkldnn_convolution runs (at::native::mkldnn_convolution).
at::Tensor conv2d_winograd(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                           std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                           int64_t groups, const c10::intrusive_ptr<WinogradWeights>& winograd) {
  const at::AutoDispatchBelowAutograd below_autograd;
  const auto direct = [&] { return at::mkldnn_convolution(x, weight, bias, padding, stride, dilation, groups); };
  if (!x.is_mkldnn() || x.dim() != 4 || x.scalar_type() != at::kFloat || x.size(1) != weight.size(1)) return direct();
  const int64_t batch = x.size(0), out_channels = weight.size(0);
  const int64_t height = x.size(2) + 2 * padding[0] - 2, width = x.size(3) + 2 * padding[1] - 2;
  if (height <= 0 || width <= 0 || !winograd_pays(batch, height, width, x.size(1), out_channels)) return direct();
  const ideep::tensor& src = ideep_tensor(x);
  const ideep::tensor no_bias;
  const ideep::tensor& bias_tensor = bias && bias->defined() ? ideep_tensor(*bias) : no_bias;
  ideep::tensor dst;
  ideep::convolution_forward_params params;
  try {
    ideep::convolution_forward::prepare(params, src, winograd->dense(), bias_tensor, {batch, out_channels, height, width},
                                        dst, stride, dilation, padding, padding, 1, ideep::scale_t(), ideep::scale_t(),
                                        ideep::scale_t(), ideep::attr_t(), ideep::algorithm::convolution_winograd,
                                        ideep::prop_kind::forward_inference);
  } catch (const std::exception&) {  // no Winograd kernel for this geometry on this CPU
    return direct();
  }
  params.scratchpad = scratchpad(params.pd.scratchpad_desc());
  ideep::convolution_forward::compute(params, src, winograd->in_layout(params.pd.weights_desc()), bias_tensor, dst);
  if (!all_finite(dst)) return direct();
  return onednn_tensor(std::move(dst));
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

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.class_<WinogradWeights>("WinogradWeights");
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
