#include "afterburner/kernels/linear_relu.h"

#include <torch/autograd.h>
#include <torch/nn/init.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/kernels/gemm.h"
#include "autocast_argument.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = x W^T + b for 2-D x, then relu in place when asked. With g = dL/dy (masked to 0 where the
// relu's y <= 0, torch's relu gradient at exactly 0): dL/dx = g W, dL/dW = g^T x, dL/db = sum over
// rows of g.
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  // The bias is optional rather than an undefined tensor: autograd Functions take no undefined inputs.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias, bool relu) {
    torch::Tensor y = bias ? kernels::addmm(*bias, x, weight.t()) : kernels::mm(x, weight.t());
    if (relu) y.relu_();
    ctx->saved_data["has_bias"] = bias.has_value();
    // dL/dW needs only x and dL/dx only W: keep each only when the other will be asked for.
    ctx->save_for_backward({relu ? y : torch::Tensor(), weight.requires_grad() ? x : torch::Tensor(),
                            x.requires_grad() ? weight : torch::Tensor()});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& y = saved[0];
    const torch::Tensor& x = saved[1];
    const torch::Tensor& weight = saved[2];
    const torch::Tensor g = y.defined() ? at::threshold_backward(grad_outputs[0], y, 0) : grad_outputs[0];
    torch::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = kernels::mm(g, weight);
    if (ctx->needs_input_grad(1)) grad_weight = kernels::mm(g.t(), x);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = g.sum(0);
    return {grad_x, grad_weight, grad_bias, torch::Tensor()};
  }
};

std::string shape(const torch::Tensor& tensor) { return tensor.defined() ? c10::str(tensor.sizes()) : "undefined"; }

void check_shapes(const char* op, const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!weight.defined() || weight.dim() != 2) {
    throw UsageError(std::string(op) + " weight", "expected [out_features, in_features], got " + shape(weight));
  }
  if (!x.defined() || x.dim() == 0 || x.size(-1) != weight.size(1)) {
    throw UsageError(std::string(op) + " x", "expected [..., " + std::to_string(weight.size(1)) +
                                                 "] to match weight " + shape(weight) + ", got " + shape(x));
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    throw UsageError(std::string(op) + " bias", "expected [" + std::to_string(weight.size(0)) +
                                                    "] to match weight " + shape(weight) + ", got " + shape(bias));
  }
}

torch::Tensor linear_maybe_relu(const char* op, const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& bias, bool relu) {
  check_shapes(op, x, weight, bias);
  const torch::Tensor rows = x.reshape({-1, x.size(-1)});
  const auto optional_bias = bias.defined() ? c10::make_optional(autocast_argument(bias)) : c10::nullopt;
  const torch::Tensor y =
      LinearFunction::apply(autocast_argument(rows), autocast_argument(weight), optional_bias, relu);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

}  // namespace

torch::Tensor linear_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return linear_maybe_relu("linear_relu", x, weight, bias, true);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return linear_maybe_relu("linear", x, weight, bias, false);
}

LinearReLUImpl::LinearReLUImpl(const LinearReLUOptions& options) : options(options) { reset(); }

LinearReLUImpl::LinearReLUImpl(const LinearReLUOptions& options, const torch::Tensor& weight,
                               const torch::Tensor& bias)
    : options(options) {
  register_parameters(weight, bias);
}

LinearReLU LinearReLUImpl::from_linear(const torch::nn::Linear& linear) {
  return LinearReLU(std::shared_ptr<LinearReLUImpl>(new LinearReLUImpl(linear->options, linear->weight, linear->bias)));
}

void LinearReLUImpl::register_parameters(const torch::Tensor& weight_tensor, const torch::Tensor& bias_tensor) {
  weight = register_parameter("weight", weight_tensor, weight_tensor.requires_grad());
  bias = register_parameter("bias", bias_tensor, bias_tensor.defined() && bias_tensor.requires_grad());
}

void LinearReLUImpl::reset() {
  const int64_t in = options.in_features(), out = options.out_features();
  register_parameters(torch::empty({out, in}, torch::requires_grad()),
                      options.bias() ? torch::empty({out}, torch::requires_grad()) : torch::Tensor());
  reset_parameters();
}

// torch::nn::Linear's initialization, so a fresh LinearReLU starts where a fresh Linear would.
void LinearReLUImpl::reset_parameters() {
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearReLUImpl::pretty_print(std::ostream& stream) const {
  stream << "afterburner::kernels::LinearReLU(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha << options.bias() << ")";
}

torch::Tensor LinearReLUImpl::forward(const torch::Tensor& input) { return linear_relu(input, weight, bias); }

}  // namespace afterburner::kernels
