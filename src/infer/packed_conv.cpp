#include "afterburner/infer/packed_conv.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <vector>

#include "afterburner/core/ideep_tensor.h"
#include "conv_sizes.h"
#include "graph_edits.h"

namespace afterburner::infer {
namespace {

namespace jit = torch::jit;

// Layouts remembered by wanted_layout, at most.
constexpr size_t kLayoutsKept = 4096;

// Whether conv2d_packed computes this convolution on oneDNN itself: a 4-D bf16 input (dense, on
// the CPU, no autograd to record), the bf16 weight it was packed from, a bf16 bias or none.
bool packed_path_suits(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias) {
  const bool records = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  const bool bias_suits = !bias || !bias->defined() || (bias->dim() == 1 && bias->scalar_type() == at::kBFloat16);
  return x.dim() == 4 && x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 &&
         x.device().is_cpu() && x.layout() == at::kStrided && x.numel() > 0 && bias_suits && !records;
}

// The layout oneDNN's convolution wants its weight in, for this geometry and these images
// (channels-last bf16): the same for every call of the same shapes, so found once per shapes.
ideep::tensor::desc wanted_layout(const std::vector<int64_t>& weight_dims, const std::vector<int64_t>& image_dims,
                                  const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                                  const std::vector<int64_t>& dilation, int64_t groups) {
  static std::mutex lock;
  static std::map<std::vector<int64_t>, ideep::tensor::desc> layouts;
  std::vector<int64_t> key = weight_dims;
  for (const auto* part : {&image_dims, &stride, &padding, &dilation}) {
    key.insert(key.end(), part->begin(), part->end());
  }
  key.push_back(groups);
  const std::lock_guard<std::mutex> guard(lock);
  auto found = layouts.find(key);
  if (found != layouts.end()) return found->second;
  if (layouts.size() >= kLayoutsKept) layouts.clear();  // shapes without end (images of every size): start again
  const ideep::tensor::desc layout = ideep::convolution_forward::expected_weights_desc(
      weight_dims, ideep::data_type::bf16, stride, padding, padding, dilation, static_cast<int>(groups),
      ideep::algorithm::convolution_direct, ideep::prop_kind::forward, ideep::data_type::bf16, image_dims,
      ideep::attr_t(), /*is_channels_last=*/true);
  return layouts.emplace(std::move(key), layout).first->second;
}

// y = conv2d(x, weight, bias) computed by oneDNN on `packed` (weight in oneDNN's blocked layout),
// the convolution LibTorch's mkldnn_convolution runs, without its reorder of the weight per call:
// channels-last in, channels-last out, the same primitive and so the same bits. Anything else
// (and every error) is at::conv2d's.
torch::Tensor conv2d_packed(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& packed,
                            const c10::optional<torch::Tensor>& bias, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  if (!packed_path_suits(x, weight, bias) || x.size(1) != weight.size(1) * groups) {
    return at::conv2d(x, weight, bias, stride, padding, dilation, groups);
  }
  const std::vector<int64_t> out_sizes = conv2d_output_sizes(x, weight, stride, padding, dilation);
  if (out_sizes[2] <= 0 || out_sizes[3] <= 0) return at::conv2d(x, weight, bias, stride, padding, dilation, groups);
  const torch::Tensor input = x.contiguous(at::MemoryFormat::ChannelsLast);
  torch::Tensor y = at::empty(out_sizes, input.options().memory_format(at::MemoryFormat::ChannelsLast));
  const auto bf16 = ideep::data_type::bf16;
  const ideep::tensor src({input.sizes().vec(), bf16, ideep::format_tag::nhwc}, input.data_ptr());
  ideep::tensor dst({out_sizes, bf16, ideep::format_tag::nhwc}, y.data_ptr());
  const std::vector<int64_t> strides = stride.vec(), dilates = dilation.vec(), pads = padding.vec();
  // Packed for images of a size guessed before any call: where these images want another layout,
  // the dense weight (oneDNN's fast reorder from it, as LibTorch's call makes) rather than a slow
  // reorder between two blocked layouts.
  const ideep::tensor& packed_weight = ideep_tensor(packed);
  const torch::Tensor weight_nhwc = weight.contiguous(at::MemoryFormat::ChannelsLast);
  const ideep::tensor dense_weight({weight.sizes().vec(), bf16, ideep::format_tag::ohwi}, weight_nhwc.data_ptr());
  const bool fits = wanted_layout(weight.sizes().vec(), input.sizes().vec(), strides, pads, dilates, groups) ==
                    packed_weight.get_desc();
  const ideep::tensor& weight_used = fits ? packed_weight : dense_weight;
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // ideep's own check
  if (bias && bias->defined()) {
    const torch::Tensor b = bias->contiguous();
    const ideep::tensor bias_tensor({{b.size(0)}, bf16, ideep::format_tag::x}, b.data_ptr());
    ideep::convolution_forward::compute</*plain_format=*/true>(src, weight_used, bias_tensor, out_sizes, dst,
                                                                 strides, dilates, pads, pads, groups);
  } else {
    ideep::convolution_forward::compute</*plain_format=*/true>(src, weight_used, out_sizes, dst, strides, dilates,
                                                                 pads, pads, groups);
  }
  // ideep writes into a buffer of its own where the primitive wants another output layout (not
  // with channels-last images): never leave y unwritten.
  if (dst.get_data_handle() != y.data_ptr()) return at::conv2d(x, weight, bias, stride, padding, dilation, groups);
  return y;
}

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.def("conv2d_packed(Tensor x, Tensor weight, Tensor packed, Tensor? bias, int[2] stride, int[2] padding, "
        "int[2] dilation, int groups) -> Tensor",
        conv2d_packed);
}

// The weight in the layout oneDNN's convolution picks for its geometry (channels-last images of
// a size derived from the filter: ideep's stand-in where the image size is not known yet; a call
// whose images want another layout runs on the dense weight, see conv2d_packed).
torch::Tensor packed_for_onednn(const torch::Tensor& weight, const std::vector<int64_t>& stride,
                                const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                                int64_t groups) {
  const torch::Tensor dense = weight.contiguous(at::MemoryFormat::ChannelsLast);
  const ideep::tensor view({dense.sizes().vec(), ideep::data_type::bf16, ideep::format_tag::ohwi}, dense.data_ptr());
  const ideep::tensor::desc layout = ideep::convolution_forward::expected_weights_desc(
      dense.sizes().vec(), ideep::data_type::bf16, stride, padding, padding, dilation, static_cast<int>(groups),
      ideep::algorithm::convolution_direct, ideep::prop_kind::forward, ideep::data_type::bf16, {}, ideep::attr_t(),
      /*is_channels_last=*/true);
  ideep::tensor buffer;
  buffer.init(layout);
  buffer.feed_from(view);
  return onednn_tensor(std::move(buffer));
}

}  // namespace

int pack_bf16_convolutions(std::shared_ptr<jit::Graph>& graph) {
  std::vector<jit::Node*> convolutions;
  for (jit::Node* node : graph->nodes()) {
    if (node->kind() == c10::aten::conv2d && node->inputs().size() == 7) convolutions.push_back(node);
  }
  int rewritten = 0;
  for (jit::Node* conv : convolutions) {
    const auto weight = jit::constant_as<at::Tensor>(conv->input(1));
    const auto stride = constant_int_pair(conv->input(3)), padding = constant_int_pair(conv->input(4)),
               dilation = constant_int_pair(conv->input(5));
    const auto groups = jit::constant_as<int64_t>(conv->input(6));
    if (!weight || weight->dim() != 4 || weight->scalar_type() != at::kBFloat16 || !stride || !padding ||
        !dilation || !groups) {
      continue;
    }
    jit::WithInsertPoint insert_point(conv);
    // Not insertConstant: it refuses tensors without storage, as oneDNN's are (optimize_for_inference
    // makes its packed fp32 weights constants this way too).
    const torch::Tensor packed = packed_for_onednn(*weight, *stride, *padding, *dilation, *groups);
    jit::Node* constant = graph->insertNode(graph->create(c10::prim::Constant));
    constant->t_(c10::attr::value, packed);
    constant->output()->inferTypeFrom(packed);
    jit::Value* packed_weight = constant->output();
    replace_by_call(conv, "afterburner::conv2d_packed",
                    {conv->input(0), conv->input(1), packed_weight, conv->input(2), conv->input(3), conv->input(4),
                     conv->input(5), conv->input(6)});
    ++rewritten;
  }
  return rewritten;
}

}  // namespace afterburner::infer
