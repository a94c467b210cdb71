#include "afterburner/kernels/low_rank.h"

#include <c10/util/StringUtil.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include "afterburner/core/error.h"
#include "afterburner/kernels/gemm.h"
#include "autocast_argument.h"

namespace afterburner::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = P b + bias with P = scale x a. With g = dL/dy and D = scale g b^T: dL/db = P^T g,
// dL/da = x^T D, dL/dx = D a^T, dL/dbias = sum over rows of g.
struct LowRankLinearFunction : torch::autograd::Function<LowRankLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& a,
                               const torch::Tensor& b, const c10::optional<torch::Tensor>& bias, double scale) {
    torch::Tensor projected = kernels::mm(x, a).mul_(scale);
    torch::Tensor y = bias ? kernels::addmm(*bias, projected, b) : kernels::mm(projected, b);
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({x, a, b, projected});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &a = saved[1], &b = saved[2];
    const double scale = ctx->saved_data["scale"].toDouble();
    // Under create_graph (grad mode on) the gradients are themselves differentiated: P, saved
    // without a graph, is recomputed from x and a, and kernels::mm records (it runs at::mm then).
    const torch::Tensor projected = torch::GradMode::is_enabled() ? kernels::mm(x, a) * scale : saved[3];
    const torch::Tensor g = grad_outputs[0].contiguous();
    torch::Tensor grad_x, grad_a, grad_b, grad_bias;
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      const torch::Tensor d = kernels::mm(g, b.t()).mul_(scale);
      if (ctx->needs_input_grad(0)) grad_x = kernels::mm(d, a.t());
      if (ctx->needs_input_grad(1)) grad_a = kernels::mm(x.t(), d);
    }
    if (ctx->needs_input_grad(2)) grad_b = kernels::mm(projected.t(), g);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(3)) grad_bias = g.sum(0);
    return {grad_x, grad_a, grad_b, grad_bias, torch::Tensor()};
  }
};

void check_shapes(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bias) {
  auto fail = [&](const char* operand, const std::string& expected, const torch::Tensor& got) {
    throw UsageError(std::string("low_rank_linear ") + operand,
                     fmt::format("expected {}, got {}", expected, got.defined() ? c10::str(got.sizes()) : "undefined"));
  };
  if (!a.defined() || a.dim() != 2) fail("a", "[K, R]", a);
  if (!b.defined() || b.dim() != 2 || b.size(0) != a.size(1)) fail("b", fmt::format("[{}, N]", a.size(1)), b);
  if (!x.defined() || x.dim() != 2 || x.size(1) != a.size(0)) fail("x", fmt::format("[M, {}]", a.size(0)), x);
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != b.size(1))) fail("bias", fmt::format("[{}]", b.size(1)), bias);
}

}  // namespace

torch::Tensor low_rank_linear(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                              const torch::Tensor& bias, double scale) {
  check_shapes(x, a, b, bias);
  const auto optional_bias = bias.defined() ? c10::make_optional(autocast_argument(bias)) : c10::nullopt;
  return LowRankLinearFunction::apply(autocast_argument(x), autocast_argument(a), autocast_argument(b), optional_bias,
                                      scale);
}

}  // namespace afterburner::kernels
