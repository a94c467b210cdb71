#include "afterburner/kernels/conv_relu.h"

#include <torch/autograd.h>

#include <memory>
#include <variant>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/kernels/conv2d.h"
#include "autocast_argument.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = relu(conv2d(x, W) + b). With g = dL/dy masked to 0 where y <= 0 (torch's relu gradient
// at exactly 0), dL/dx, dL/dW and dL/db are the convolution's gradients for upstream g.
struct Conv2dReLUFunction : torch::autograd::Function<Conv2dReLUFunction> {
  // The bias is optional rather than an undefined tensor: autograd Functions take no undefined inputs.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias, std::vector<int64_t> stride,
                               std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
    torch::Tensor y = at::convolution(x, weight, bias, stride, padding, dilation, false, {0, 0}, groups);
    y.relu_();
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["groups"] = groups;
    ctx->save_for_backward({y, x, weight});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& y = saved[0];
    const torch::Tensor& x = saved[1];
    const torch::Tensor& weight = saved[2];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const torch::Tensor g = at::threshold_backward(grad_outputs[0], y, 0);
    auto [grad_x, grad_weight, grad_bias] = conv2d_backward(
        g, x, weight, has_bias, ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
        ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt(),
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), has_bias && ctx->needs_input_grad(2)});
    return {grad_x, grad_weight, grad_bias, {}, {}, {}, {}};
  }
};

std::vector<int64_t> explicit_padding(const Conv2dReLUOptions& options) {
  using std::get;
  using std::holds_alternative;
  if (holds_alternative<torch::enumtype::kValid>(options.padding())) return {0, 0};
  const auto& padding = get<torch::ExpandingArray<2>>(options.padding());
  return {padding->begin(), padding->end()};
}

// Why a convolution with this padding cannot take the fused path, or "" when it can.
std::string unsupported(const Conv2dReLUOptions::padding_t& padding, const Conv2dReLUOptions::padding_mode_t& mode) {
  using std::holds_alternative;
  if (!holds_alternative<torch::enumtype::kZeros>(mode)) return "only zero padding is supported";
  if (holds_alternative<torch::enumtype::kSame>(padding)) return "padding \"same\" is not supported";
  return "";
}

// A Conv2d module's options (the N-d kind) as the Conv2dOptions they were made from.
Conv2dReLUOptions options_of(const torch::nn::Conv2d& conv) {
  const auto& o = conv->options;
  return Conv2dReLUOptions(o.in_channels(), o.out_channels(), o.kernel_size())
      .stride(o.stride())
      .padding(o.padding())
      .dilation(o.dilation())
      .groups(o.groups())
      .bias(o.bias())
      .padding_mode(o.padding_mode());
}

}  // namespace

std::string conv_relu_unsupported(const torch::nn::Conv2d& conv) {
  return unsupported(conv->options.padding(), conv->options.padding_mode());
}

Conv2dReLUImpl::Conv2dReLUImpl(const Conv2dReLUOptions& options) : options(options) { reset(); }

Conv2dReLUImpl::Conv2dReLUImpl(const Conv2dReLUOptions& options, const torch::Tensor& weight,
                               const torch::Tensor& bias)
    : options(options) {
  register_parameters(weight, bias);
}

Conv2dReLU Conv2dReLUImpl::from_conv(const torch::nn::Conv2d& conv) {
  if (auto reason = conv_relu_unsupported(conv); !reason.empty()) throw UsageError("Conv2dReLU", reason);
  return Conv2dReLU(std::shared_ptr<Conv2dReLUImpl>(new Conv2dReLUImpl(options_of(conv), conv->weight, conv->bias)));
}

void Conv2dReLUImpl::register_parameters(const torch::Tensor& weight_tensor, const torch::Tensor& bias_tensor) {
  weight = register_parameter("weight", weight_tensor, weight_tensor.requires_grad());
  bias = register_parameter("bias", bias_tensor, bias_tensor.defined() && bias_tensor.requires_grad());
}

// torch::nn::Conv2d's own initialization: a fresh Conv2dReLU starts where a fresh Conv2d would.
void Conv2dReLUImpl::reset() {
  if (auto reason = unsupported(options.padding(), options.padding_mode()); !reason.empty()) {
    throw UsageError("Conv2dReLU", reason);
  }
  const torch::nn::Conv2d conv(options);
  register_parameters(conv->weight, conv->bias);
}

void Conv2dReLUImpl::pretty_print(std::ostream& stream) const {
  stream << "afterburner::kernels::Conv2dReLU(" << options.in_channels() << ", " << options.out_channels()
         << ", kernel_size=" << options.kernel_size() << ", stride=" << options.stride() << ")";
}

torch::Tensor Conv2dReLUImpl::forward(const torch::Tensor& input) {
  return conv2d_relu(input, weight, bias, *options.stride(), explicit_padding(options), *options.dilation(),
                     options.groups());
}

torch::Tensor conv2d_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  if (x.dim() == 3) {  // unbatched, as Conv2d takes it
    return conv2d_relu(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  }
  const auto optional_bias = bias.defined() ? c10::make_optional(autocast_argument(bias)) : c10::nullopt;
  return Conv2dReLUFunction::apply(autocast_argument(x), autocast_argument(weight), optional_bias, stride.vec(),
                                   padding.vec(), dilation.vec(), groups);
}

}  // namespace afterburner::kernels
