#include "afterburner/infer/conv_activation.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "afterburner/infer/winograd_conv.h"
#include "afterburner/kernels/depthwise_conv.h"
#include "conv_bounds.h"
#include "conv_sizes.h"
#include "graph_edits.h"
#include "winograd_weights.h"

namespace afterburner::infer {

enum class Activation : int64_t { clip, hardswish, silu, gelu };

// A convolution's activation, as oneDNN's post-op and as ATen's op, and what bounds the
// convolution's sums: |sum| <= max|x| * (the largest sum of one output's weight magnitudes) +
// max|bias|. Every activation here maps a value to one of no larger magnitude (or into clip's
// bounds), so that bound holds for the activation's output too.
class ConvActivation : public torch::CustomClassHolder {
 public:
  ConvActivation(Activation kind, double lower, double upper, double weight_row_sum, double largest_bias)
      : kind_(kind), lower_(lower), upper_(upper), weight_row_sum_(weight_row_sum), largest_bias_(largest_bias) {}

  ideep::attr_t post_op() const {
    switch (kind_) {
      case Activation::clip:  // ReLU as ReLU: oneDNN's Winograd kernels take no other post-op
        return lower_ == 0 && upper_ == std::numeric_limits<double>::infinity()
                   ? ideep::attr_t::fuse_relu()
                   : ideep::attr_t::fuse_clamp(static_cast<float>(lower_), static_cast<float>(upper_));
      case Activation::hardswish: return ideep::attr_t::fuse_hardswish();
      case Activation::silu: return ideep::attr_t::fuse_swish(1.f, 1.f);  // x * sigmoid(1 * x)
      case Activation::gelu: return ideep::attr_t::fuse_gelu();            // erf form
    }
    return {};
  }

  // The activation as our depthwise kernel applies it; gelu is not among them.
  std::optional<kernels::DepthwiseEpilogue> depthwise_epilogue() const {
    switch (kind_) {
      case Activation::clip:
        return kernels::DepthwiseEpilogue{kernels::DepthwiseActivation::clip, static_cast<float>(lower_),
                                          static_cast<float>(upper_)};
      case Activation::hardswish: return kernels::DepthwiseEpilogue{kernels::DepthwiseActivation::hardswish};
      case Activation::silu: return kernels::DepthwiseEpilogue{kernels::DepthwiseActivation::silu};
      case Activation::gelu: return std::nullopt;
    }
    return std::nullopt;
  }

  // ATen's activation of a convolution's output, in place: the convolution made it for us.
  at::Tensor unfused(at::Tensor y) const {
    switch (kind_) {
      case Activation::clip: return at::hardtanh_(y, lower_, upper_);  // clamp's values too
      case Activation::hardswish: return at::hardswish_(y);
      case Activation::silu: return at::silu_(y);
      case Activation::gelu: return at::gelu(y);
    }
    return y;
  }

  // The bound of the sums (and of the activation's output) for inputs of magnitude up to
  // `input_bound`: +infinity for an input bound that is not finite.
  double output_bound(double input_bound) const {
    if (!(input_bound < std::numeric_limits<double>::infinity())) return std::numeric_limits<double>::infinity();
    const double sums = input_bound * weight_row_sum_ + largest_bias_;
    return kind_ == Activation::clip ? std::min(sums, std::max(-lower_, upper_)) : sums;
  }

 private:
  Activation kind_;
  double lower_, upper_;  // clip's bounds
  double weight_row_sum_, largest_bias_;
};

namespace {

namespace jit = torch::jit;

// A depthwise convolution and its activation by our kernel (kernels/depthwise_conv.h), which
// computes them as ATen does for any input, NaN and infinities included, where it pays: stride 1
// on images of more than 28x28 (about twice oneDNN's speed at 56x56 and 112x112; as fast as oneDNN
// at stride 2 and on smaller images, plus its weights' repacking each call). Else nullopt.
std::optional<at::Tensor> depthwise(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                    const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                                    const std::vector<int64_t>& dilation, int64_t groups,
                                    const ConvActivation& activation) {
  const auto epilogue = activation.depthwise_epilogue();
  const bool square = stride.size() == 2 && stride[0] == stride[1] && padding.size() == 2 && padding[0] == padding[1];
  const bool pays = stride == std::vector<int64_t>{1, 1} && x.size(2) * x.size(3) > 28 * 28;
  if (!epilogue || !pays || groups != x.size(1) || groups < 2 || !square || dilation != std::vector<int64_t>{1, 1}) {
    return std::nullopt;
  }
  const auto dense = [](const at::Tensor& t) { return t.is_mkldnn() ? t.to_dense() : t; };
  return kernels::depthwise_conv2d_onednn(x, dense(weight), bias && bias->defined() ? dense(*bias) : at::Tensor(),
                                          stride[0], padding[0], *epilogue);
}

// (y, bound): y = activation(conv2d(x, weight, bias)) on oneDNN tensors, and a bound of |y|
// (+infinity where none is known). Where the sums are certainly finite (the convolution holds no NaN
// or infinity for oneDNN's post-op to treat otherwise than ATen), oneDNN's convolution
// (Winograd's where `winograd` is given and it pays, else direct) with the activation as its
// post-op; else the convolution and ATen's activation one after the other. `input_bound` bounds
// |x| when the op before computed x (the bound it returned); without it x's largest magnitude is
// read, unless x is over twice the size of y: then that read would cost more than the activation's
// own pass over y, which runs instead.
std::tuple<at::Tensor, double> conv2d_activation(const at::Tensor& x, const at::Tensor& weight,
                                                 const c10::optional<at::Tensor>& bias, std::vector<int64_t> stride,
                                                 std::vector<int64_t> padding, std::vector<int64_t> dilation,
                                                 int64_t groups, const c10::intrusive_ptr<ConvActivation>& activation,
                                                 const c10::optional<c10::intrusive_ptr<WinogradWeights>>& winograd,
                                                 c10::optional<double> input_bound) {
  const at::AutoDispatchBelowAutograd below_autograd;
  const auto winograd_weights = winograd.value_or(c10::intrusive_ptr<WinogradWeights>());
  const auto unfused = [&] {
    const at::Tensor y = convolve_on_onednn(x, weight, bias, stride, padding, dilation, groups, winograd_weights);
    return std::make_tuple(activation->unfused(y), std::numeric_limits<double>::infinity());
  };
  if (!x.is_mkldnn() || x.dim() != 4 || x.scalar_type() != at::kFloat) return unfused();
  if (auto y = depthwise(x, weight, bias, stride, padding, dilation, groups, *activation)) {
    return {*y, activation->output_bound(input_bound.value_or(std::numeric_limits<double>::infinity()))};
  }
  const std::vector<int64_t> out_sizes = conv2d_output_sizes(x, weight, stride, padding, dilation);
  double bound = activation->output_bound(input_bound.value_or(std::numeric_limits<double>::infinity()));
  if (!(bound < kFiniteSums)) {
    if (x.numel() > 2 * c10::multiply_integers(out_sizes)) return unfused();
    bound = activation->output_bound(largest_magnitude(ideep_tensor(x)));
    if (!(bound < kFiniteSums)) return unfused();
  }
  const ideep::attr_t post_op = activation->post_op();
  if (winograd_weights) {
    if (auto y = winograd_convolution(x, *winograd_weights, bias, padding, post_op)) return {*y, bound};
    // Where Winograd pays but takes no such post-op, Winograd then ATen's activation (the sums are finite).
    if (auto y = winograd_convolution(x, *winograd_weights, bias, padding, ideep::attr_t())) {
      return {activation->unfused(*y), bound};
    }
  }
  const ideep::tensor no_bias;
  ideep::tensor y;
  ideep::convolution_forward::compute_v3(ideep_tensor(x), ideep_tensor(weight),
                                         bias && bias->defined() ? ideep_tensor(*bias) : no_bias, out_sizes, y, stride,
                                         dilation, padding, padding, static_cast<int>(groups),
                                         /*is_channels_last=*/false, post_op);
  return {onednn_tensor(std::move(y)), bound};
}

// y = relu(y + residual) over two buffers of one layout (padding channels: 0 + 0, kept 0), in
// one pass where ATen's add_ and hardtanh_ make two; the sum then the ReLU, each as ATen rounds it.
void add_relu_in_place(const ideep::tensor& y, const ideep::tensor& residual) {
  auto* out = static_cast<float*>(y.get_data_handle());
  const auto* add = static_cast<const float*>(residual.get_data_handle());
  at::parallel_for(0, static_cast<int64_t>(y.get_size() / sizeof(float)), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float sum = out[i] + add[i];
      out[i] = sum < 0.0f ? 0.0f : sum;
    }
  });
}

// (y, bound): y = relu(conv2d(x, weight, bias) + residual), a residual block's end (ResNet's).
// Where the sums and the residual are certainly finite (bounded as conv2d_activation bounds them,
// the residual's magnitude added), oneDNN's Winograd convolution, whose output needs no check for
// NaN then, and the sum and ReLU in one pass over it; else the convolution, ATen's add and ReLU one
// after the other, as the graph computed them (its bits). oneDNN 2.6's Winograd kernels take no
// sum post-op ("could not create a descriptor"): the pass is ours. `residual_bound` bounds
// |residual| where the op that computed it returned one, else it is read.
std::tuple<at::Tensor, double> conv2d_add_relu(const at::Tensor& x, const at::Tensor& weight,
                                               const c10::optional<at::Tensor>& bias, std::vector<int64_t> stride,
                                               std::vector<int64_t> padding, std::vector<int64_t> dilation,
                                               int64_t groups, const c10::intrusive_ptr<ConvActivation>& relu,
                                               const c10::intrusive_ptr<WinogradWeights>& winograd,
                                               const at::Tensor& residual, c10::optional<double> input_bound,
                                               c10::optional<double> residual_bound) {
  const at::AutoDispatchBelowAutograd below_autograd;
  const auto unfused = [&] {
    at::Tensor y = convolve_on_onednn(x, weight, bias, stride, padding, dilation, groups, winograd);
    y.add_(residual);
    return std::make_tuple(relu->unfused(y), std::numeric_limits<double>::infinity());
  };
  const auto onednn_fp32 = [](const at::Tensor& t) { return t.is_mkldnn() && t.scalar_type() == at::kFloat; };
  if (!onednn_fp32(x) || !onednn_fp32(residual) || x.dim() != 4) return unfused();
  const std::vector<int64_t> out_sizes = conv2d_output_sizes(x, weight, stride, padding, dilation);
  if (residual.sizes() != at::IntArrayRef(out_sizes) ||
      !winograd_pays(out_sizes[0], out_sizes[2], out_sizes[3], x.size(1), out_sizes[1])) {
    return unfused();  // before reading any bound
  }
  const double sums = relu->output_bound(input_bound ? *input_bound : largest_magnitude(ideep_tensor(x)));
  const double bound = sums + (residual_bound ? *residual_bound : largest_magnitude(ideep_tensor(residual)));
  if (!(bound < kFiniteSums)) return unfused();
  const auto y = winograd_convolution(x, *winograd, bias, padding, ideep::attr_t());
  if (!y || ideep_tensor(*y).get_desc() != ideep_tensor(residual).get_desc()) return unfused();
  add_relu_in_place(ideep_tensor(*y), ideep_tensor(residual));
  return {*y, bound};
}

// The bound of a constant in (-inf, inf] an activation's Scalar? argument holds: None is `none`.
std::optional<double> scalar_bound(jit::Value* value, double none) {
  const auto constant = jit::toIValue(value);
  if (!constant) return std::nullopt;
  if (constant->isNone()) return none;
  if (constant->isDouble() || constant->isInt()) return constant->toScalar().toDouble();
  return std::nullopt;
}

// The activation `node` computes, with its bounds for clip, if oneDNN has it as a post-op that
// maps 0 to 0 (the padding channels of oneDNN's blocked layouts stay 0).
std::optional<std::tuple<Activation, double, double>> activation_of(jit::Node* node) {
  const std::string kind = node->kind().toQualString();
  const double inf = std::numeric_limits<double>::infinity();
  if (kind == "aten::hardswish" || kind == "aten::hardswish_") return std::make_tuple(Activation::hardswish, 0., 0.);
  if (kind == "aten::silu" || kind == "aten::silu_") return std::make_tuple(Activation::silu, 0., 0.);
  if (kind == "aten::gelu") {
    const auto approximate = jit::constant_as<std::string>(node->input(1));
    if (approximate != "none") return std::nullopt;
    return std::make_tuple(Activation::gelu, 0., 0.);
  }
  if (kind == "aten::hardtanh" || kind == "aten::hardtanh_" || kind == "aten::clamp" || kind == "aten::clamp_") {
    if (node->inputs().size() != 3) return std::nullopt;
    const auto lower = scalar_bound(node->input(1), -inf), upper = scalar_bound(node->input(2), inf);
    if (!lower || !upper || *lower > 0 || *upper < 0) return std::nullopt;
    return std::make_tuple(Activation::clip, *lower, *upper);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::pair<double, double>> sum_bounds(const jit::Node* conv) {
  const c10::Symbol onednn_constant = c10::Symbol::fromQualString("prim::ConstantMKLDNNTensor");
  const jit::Node* weight = conv->input(1)->node();
  if (weight->kind() != onednn_constant) return std::nullopt;
  const at::Tensor w = weight->t(c10::attr::value).to_dense();
  if (w.dim() != 4 || w.scalar_type() != at::kFloat) return std::nullopt;
  double largest_bias = 0;
  const jit::Node* bias = conv->input(2)->node();
  if (bias->kind() == onednn_constant) {
    largest_bias = bias->t(c10::attr::value).to_dense().abs().max().item<double>();
  } else if (!jit::toIValue(conv->input(2)) || !jit::toIValue(conv->input(2))->isNone()) {
    return std::nullopt;
  }
  return std::make_pair(w.abs().sum({1, 2, 3}).max().item<double>(), largest_bias);
}

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.class_<ConvActivation>("ConvActivation");
  register_winograd_weights_class();
  m.def("conv2d_activation(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
        "int groups, __torch__.torch.classes.afterburner.ConvActivation activation, "
        "__torch__.torch.classes.afterburner.WinogradWeights? winograd, float? input_bound) -> (Tensor, float)",
        conv2d_activation);
  m.def("conv2d_add_relu(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
        "int groups, __torch__.torch.classes.afterburner.ConvActivation relu, "
        "__torch__.torch.classes.afterburner.WinogradWeights winograd, Tensor residual, float? input_bound, "
        "float? residual_bound) -> (Tensor, float)",
        conv2d_add_relu);
}

namespace {

const c10::Symbol kFusedActivation = c10::Symbol::fromQualString("afterburner::conv2d_activation");
const c10::Symbol kFusedSum = c10::Symbol::fromQualString("afterburner::conv2d_add_relu");
const c10::Symbol kWinograd = c10::Symbol::fromQualString("afterburner::conv2d_winograd");
const c10::Symbol kOnednnConvolution = c10::Symbol::fromQualString("prim::mkldnn_convolution");

// A call of `op` on `conv`'s inputs (x, weight, bias, stride, padding, dilation, groups), then
// `more`, in the place of `last` (destroyed), the fused pattern's last node.
jit::Node* fused_node(const char* op, jit::Node* conv, jit::Node* last, const std::vector<jit::Value*>& more) {
  std::vector<jit::Value*> inputs(conv->inputs().begin(), conv->inputs().begin() + 7);
  inputs.insert(inputs.end(), more.begin(), more.end());
  return replace_by_bounded_call(last, op, inputs);
}

// conv -> activation as afterburner::conv2d_activation; nullptr where the pattern or the bounds are not there.
jit::Node* fuse_activation(jit::Graph& graph, jit::Node* conv, jit::Node* user) {
  const auto activation = activation_of(user);
  const auto bounds = sum_bounds(conv);
  if (!activation || !bounds || user->input(0) != conv->output()) return nullptr;
  const auto [kind, lower, upper] = *activation;
  jit::WithInsertPoint insert_point(conv);
  jit::Value* holder = graph.insertConstant(
      c10::IValue(c10::make_intrusive<ConvActivation>(kind, lower, upper, bounds->first, bounds->second)));
  jit::Value* winograd = conv->kind() == kWinograd ? conv->input(7) : graph.insertConstant(c10::IValue());
  jit::Value* input_bound = graph.insertConstant(c10::IValue());  // connected by connect_bounds
  jit::Node* node = fused_node("afterburner::conv2d_activation", conv, user, {holder, winograd, input_bound});
  conv->destroy();
  return node;
}

// Winograd's conv -> prim::BroadcastMKLDNNTensors(y, residual) -> aten::add_(y, residual, 1) ->
// ReLU (the add writing into the convolution's output) as afterburner::conv2d_add_relu; nullptr
// where the pattern or the bounds are not there.
jit::Node* fuse_residual_sum(jit::Graph& graph, jit::Node* conv, jit::Node* broadcast) {
  if (conv->kind() != kWinograd || broadcast->kind() != c10::prim::BroadcastMKLDNNTensors ||
      broadcast->input(0) != conv->output() || broadcast->output(0)->uses().size() != 1 ||
      broadcast->output(1)->uses().size() != 1) {
    return nullptr;
  }
  jit::Node* add = broadcast->output(0)->uses()[0].user;
  if (add->kind() != c10::aten::add_ || add->inputs().size() != 3 || add->input(0) != broadcast->output(0) ||
      add->input(1) != broadcast->output(1) || add->output()->uses().size() != 1) {
    return nullptr;
  }
  const auto alpha = jit::toIValue(add->input(2));
  if (!alpha || !alpha->isScalar() || alpha->toScalar().toDouble() != 1) return nullptr;
  jit::Node* relu = add->output()->uses()[0].user;
  const auto activation = activation_of(relu);
  const auto bounds = sum_bounds(conv);
  if (!activation || !bounds || relu->input(0) != add->output() ||
      *activation != std::make_tuple(Activation::clip, 0., std::numeric_limits<double>::infinity())) {
    return nullptr;
  }
  jit::WithInsertPoint insert_point(conv);
  jit::Value* holder = graph.insertConstant(c10::IValue(c10::make_intrusive<ConvActivation>(
      Activation::clip, 0., std::numeric_limits<double>::infinity(), bounds->first, bounds->second)));
  jit::Value* no_bound = graph.insertConstant(c10::IValue());  // connected by connect_bounds
  jit::Node* node = fused_node("afterburner::conv2d_add_relu", conv, relu,
                               {holder, conv->input(7), broadcast->input(1), no_bound, no_bound});
  add->destroy();
  broadcast->destroy();
  conv->destroy();
  return node;
}

// Whether every use of `value` reads it as a convolution's input or as a fused sum's residual:
// nothing writes it in place, so a bound of it taken where it was made holds at each use.
bool read_by_convolutions_only(const jit::Value* value) {
  return std::all_of(value->uses().begin(), value->uses().end(), [](const jit::Use& use) {
    const c10::Symbol kind = use.user->kind();
    const bool convolved = use.offset == 0 && (kind == kFusedActivation || kind == kFusedSum || kind == kWinograd ||
                                               kind == kOnednnConvolution);
    return convolved || (use.offset == 9 && kind == kFusedSum);
  });
}

// The bound `value`'s op returned alongside it (a fused convolution's, or BatchNorm and ReLU
// written into oneDNN's layout), where one did and it holds at every use; else nullptr.
jit::Value* returned_bound(jit::Value* value) {
  const c10::Symbol kind = value->node()->kind();
  const bool returns_bound = kind == kFusedActivation || kind == kFusedSum ||
                             kind == c10::Symbol::fromQualString("afterburner::scale_shift_relu_to_onednn");
  return returns_bound && value->offset() == 0 && read_by_convolutions_only(value) ? value->node()->output(1)
                                                                                    : nullptr;
}

// Each fused node takes the bounds of its input (and residual) the ops that made them returned:
// a chain's first convolution reads its input's magnitudes, the others need not.
void connect_bounds(const std::vector<jit::Node*>& fused) {
  for (jit::Node* node : fused) {
    const bool sum = node->kind() == kFusedSum;
    if (jit::Value* bound = returned_bound(node->input(0))) node->replaceInput(sum ? 10 : 9, bound);
    if (jit::Value* bound = sum ? returned_bound(node->input(9)) : nullptr) node->replaceInput(11, bound);
  }
}

}  // namespace

int fuse_activations_into_convolutions(std::shared_ptr<jit::Graph>& graph) {
  std::vector<jit::Node*> convolutions;
  for (jit::Node* node : graph->nodes()) {
    if (node->kind() == kOnednnConvolution || node->kind() == kWinograd) convolutions.push_back(node);
  }
  std::vector<jit::Node*> fused;
  for (jit::Node* conv : convolutions) {
    if (conv->output()->uses().size() != 1) continue;
    jit::Node* user = conv->output()->uses()[0].user;
    jit::Node* node = fuse_activation(*graph, conv, user);
    if (!node) node = fuse_residual_sum(*graph, conv, user);
    if (node) fused.push_back(node);
  }
  connect_bounds(fused);
  return static_cast<int>(fused.size());
}

}  // namespace afterburner::infer
