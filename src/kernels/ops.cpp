// The fused kernels as dispatcher ops, `afterburner::<name>`: one registration serves eager
// Python (torch.ops.afterburner.<name>, loaded from the Python package's shared library),
// torch.jit.script and torch.jit.trace, and TorchScript files that afterburner's C++ tools load.
// Each op has an Autograd kernel (the kernel's own autograd Function, so gradients flow) and a
// CPU kernel for calls below autograd (inference mode), which records nothing.
#include <torch/library.h>

#include "afterburner/core/error.h"
#include "afterburner/kernels/add_activation.h"
#include "afterburner/kernels/attention.h"
#include "afterburner/kernels/dropout.h"
#include "afterburner/kernels/conv_relu.h"
#include "afterburner/kernels/cross_entropy.h"
#include "afterburner/kernels/conv2d.h"
#include "afterburner/kernels/flat_optim.h"
#include "afterburner/kernels/fuse.h"
#include "afterburner/kernels/gelu.h"
#include "afterburner/kernels/layer_norm.h"
#include "afterburner/kernels/linear_relu.h"
#include "afterburner/kernels/low_rank.h"
#include "afterburner/kernels/relu_maxpool.h"

namespace afterburner::kernels {
namespace {

torch::Tensor or_undefined(const c10::optional<torch::Tensor>& tensor) { return tensor.value_or(torch::Tensor()); }

// max_pool2d's arguments: square windows take the fused kernel (which validates them), others
// torch's relu and max_pool2d.
torch::Tensor relu_max_pool2d_op(const torch::Tensor& x, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                 at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  if (stride.empty()) stride = kernel_size;
  const auto square = [](at::IntArrayRef pair) { return pair.size() == 2 && pair[0] == pair[1]; };
  if (!square(kernel_size) || !square(stride) || !square(padding) || !square(dilation)) {
    return at::max_pool2d(at::relu(x), kernel_size, stride, padding, dilation, ceil_mode);
  }
  return relu_max_pool2d(x, ReluMaxPool2dOptions(kernel_size[0])
                                .stride(stride[0])
                                .padding(padding[0])
                                .dilation(dilation[0])
                                .ceil_mode(ceil_mode));
}

torch::Tensor linear_relu_op(const torch::Tensor& x, const torch::Tensor& weight,
                             const c10::optional<torch::Tensor>& bias) {
  return linear_relu(x, weight, or_undefined(bias));
}

torch::Tensor conv2d_relu_op(const torch::Tensor& x, const torch::Tensor& weight,
                             const c10::optional<torch::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                             at::IntArrayRef dilation, int64_t groups) {
  return conv2d_relu(x, weight, or_undefined(bias), stride, padding, dilation, groups);
}

torch::Tensor conv2d_op(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                        at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  return conv2d(x, weight, or_undefined(bias), stride, padding, dilation, groups);
}

torch::Tensor add_activation_op(const torch::Tensor& a, const torch::Tensor& b, c10::string_view activation) {
  return add_activation(a, b, activation_named(std::string(activation), "activation"));
}

torch::Tensor layer_norm_op(const torch::Tensor& x, at::IntArrayRef normalized_shape,
                            const c10::optional<torch::Tensor>& weight, const c10::optional<torch::Tensor>& bias,
                            double eps, bool bf16_for_autocast) {
  return layer_norm(x, normalized_shape, or_undefined(weight), or_undefined(bias), eps, bf16_for_autocast);
}

torch::Tensor low_rank_linear_op(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                                 const c10::optional<torch::Tensor>& bias, double scale, bool relu, double dropout,
                                 bool train) {
  return low_rank_linear(x, a, b, or_undefined(bias), scale, LowRankEpilogue().relu(relu).dropout(dropout).train(train));
}

void sgd_step_op(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                 const c10::List<bool>& fresh, double lr, double momentum, double dampening, double weight_decay,
                 bool nesterov) {
  sgd_step(params, grads, momentum_buffers, std::vector<bool>(fresh.begin(), fresh.end()),
           torch::optim::SGDOptions(lr).momentum(momentum).dampening(dampening).weight_decay(weight_decay).nesterov(
               nesterov));
}

void adamw_step_op(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                   at::IntArrayRef steps, double lr, double beta1, double beta2, double eps, double weight_decay) {
  adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps,
             torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay));
}

std::tuple<c10::IValue, std::vector<std::string>, std::vector<std::string>> fuse_script_op(const c10::IValue& module) {
  if (!module.isObject() || !module.toObject()->type()->is_module() ||
      !module.toObject()->type()->findMethod("forward")) {
    throw UsageError("module", "expected a TorchScript module with a forward (torch.jit.script or torch.jit.trace), "
                               "got " + module.type()->repr_str());
  }
  FusedScript fused = fuse_script(torch::jit::Module(module.toObject()));
  return {fused.module._ivalue(), std::move(fused.fused), std::move(fused.notices)};
}

// `op` with gradient recording off: the CPU kernel, reached only below autograd.
template <auto op>
struct WithoutGrad;
template <typename Result, typename... Args, Result (*op)(Args...)>
struct WithoutGrad<op> {
  static Result call(Args... args) {
    const at::NoGradGuard no_grad;
    return op(args...);
  }
};

template <auto op>
void register_kernels(torch::Library& library, const char* name) {
  library.impl(name, torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN(op)));
  library.impl(name, torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(WithoutGrad<op>::call)));
}

}  // namespace

TORCH_LIBRARY(afterburner, m) {
  // max_pool2d(relu(x)), with max_pool2d's arguments (an empty stride is the kernel size).
  m.def("relu_max_pool2d(Tensor x, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, "
        "bool ceil_mode=False) -> Tensor");
  register_kernels<relu_max_pool2d_op>(m, "relu_max_pool2d");
  // On oneDNN tensors too (an optimized inference graph's), in their own layout.
  m.impl("relu_max_pool2d", torch::dispatch(c10::DispatchKey::MkldnnCPU, TORCH_FN(WithoutGrad<relu_max_pool2d_op>::call)));
  // a * b with broadcasting, as aten::mul; on oneDNN tensors a [N, C, 1, 1] scale of a [N, C, H, W]
  // tensor multiplies in the big one's layout (kernels/onednn_elementwise.cpp).
  m.def("broadcast_mul(Tensor a, Tensor b) -> Tensor");
  // relu(x * scale + shift) per channel of a dense x, as a oneDNN tensor, and a bound of its
  // magnitudes (kernels/onednn_elementwise.cpp).
  m.def("scale_shift_relu_to_onednn(Tensor x, Tensor scale, Tensor shift) -> (Tensor, float)");
  // torch.cat(tensors, 1) in a buffer with `spare` more channels, and torch.cat([held, *more], 1)
  // writing only `more` into held's buffer where it has room (kernels/channel_concat.h).
  m.def("concat_reserve(Tensor[] tensors, int spare) -> Tensor");
  m.def("concat_append(Tensor(a) held, Tensor[] more, int spare) -> Tensor(a)");
  // relu(x weight^T + bias), as relu(linear(x, weight, bias)).
  m.def("linear_relu(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  register_kernels<linear_relu_op>(m, "linear_relu");
  // relu(conv2d(x, weight, bias, stride, padding, dilation, groups)), zero padding.
  m.def("conv2d_relu(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
        "int[2] dilation=1, int groups=1) -> Tensor");
  register_kernels<conv2d_relu_op>(m, "conv2d_relu");
  // conv2d(x, weight, bias, stride, padding, dilation, groups), zero padding; depthwise ones
  // (groups == channels, one filter each) train on afterburner's weight gradient, those of
  // 1-pixel images as a linear layer (kernels/conv2d.h).
  m.def("conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, int[2] dilation=1, "
        "int groups=1) -> Tensor");
  register_kernels<conv2d_op>(m, "conv2d");
  // mean over rows of -log_softmax(logits)[row, target[row]], as cross_entropy(logits, target).
  m.def("cross_entropy(Tensor logits, Tensor target) -> Tensor");
  register_kernels<cross_entropy>(m, "cross_entropy");
  // scale (x a) b + bias: the two GEMMs of a sketched layer; then relu where asked, then dropout
  // with probability `dropout` in training, in the same node.
  m.def("low_rank_linear(Tensor x, Tensor a, Tensor b, Tensor? bias=None, float scale=1.0, bool relu=False, "
        "float dropout=0.0, bool train=False) -> Tensor");
  register_kernels<low_rank_linear_op>(m, "low_rank_linear");
  // (softmax(query key^T * scale + attn_mask) * dropout_mask) value, as torch 2.x's
  // scaled_dot_product_attention with its dropout's noise given: bool masks true = attend,
  // is_causal the top-left-aligned lower triangle, scale 1/sqrt(head dim) unless given
  // (kernels::attention).
  m.def("attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, bool is_causal=False, "
        "float? scale=None, Tensor? dropout_mask=None) -> Tensor");
  register_kernels<attention>(m, "attention");
  // aten::dropout's answer, bit for bit from the same draws of the default CPU generator, drawn in
  // bulk (kernels::dropout); autograd through the ATen ops it ends in.
  m.def("dropout(Tensor input, float p, bool train) -> Tensor", dropout);
  // x / 2 (1 + erf(x / sqrt(2))), as aten::gelu(x) (approximate "none"), in one pass that reads and
  // writes bf16 directly (kernels::gelu).
  m.def("gelu(Tensor x) -> Tensor");
  register_kernels<gelu>(m, "gelu");
  // (x - mean) / sqrt(var + eps) * weight + bias over the last dimensions, as aten::layer_norm; under
  // autocast from a bf16 input read as it is to the fp32 result, or to that result rounded to bf16
  // where every reader casts it so (bf16_for_autocast, kernels::layer_norm).
  m.def("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, "
        "bool bf16_for_autocast=False) -> Tensor");
  register_kernels<layer_norm_op>(m, "layer_norm");
  // activation(a + b) for activation "relu" or "silu", as eager LibTorch computes the two ops (the
  // sum in the dtype a and b promote to), in one pass each way (kernels::add_activation).
  m.def("add_activation(Tensor a, Tensor b, str activation) -> Tensor");
  register_kernels<add_activation_op>(m, "add_activation");
  // One in-place step of torch.optim.SGD / AdamW over all the tensors given, in one fused pass
  // (kernels::sgd_step / adamw_step); run under no_grad, as optimizers step.
  m.def("sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, bool[] fresh, float lr, "
        "float momentum, float dampening, float weight_decay, bool nesterov) -> ()",
        sgd_step_op);
  m.def("adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "int[] steps, float lr, float beta1, float beta2, float eps, float weight_decay) -> ()",
        adamw_step_op);
  // A TorchScript module's copy with its forward fused (kernels::fuse_script), and what was fused
  // and left: afterburner.jit.fuse.
  m.def("fuse_script(Any module) -> (Any, str[], str[])", fuse_script_op);
}

}  // namespace afterburner::kernels
