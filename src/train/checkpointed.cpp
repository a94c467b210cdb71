#include "afterburner/train/checkpointed.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"

namespace afterburner::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward runs the module without recording a graph; backward re-runs it with grad enabled,
// from the saved input and under the forward's RNG and autocast state, then differentiates
// that local graph. Parameters are passed in so autograd routes their gradients here.
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList params,
                               CheckpointedImpl* module) {
    ctx->save_for_backward({x});
    ctx->saved_data["params"] = params.vec();
    // The module outlives every backward through it (the model owns it).
    ctx->saved_data["module"] = reinterpret_cast<int64_t>(module);
    ctx->saved_data["rng"] = at::detail::getDefaultCPUGenerator().get_state();
    ctx->saved_data["autocast"] = at::autocast::is_cpu_enabled();
    ctx->saved_data["autocast_dtype"] = at::autocast::get_autocast_cpu_dtype();
    torch::NoGradGuard no_grad;
    return {module->forward_inner(x)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    auto params = ctx->saved_data["params"].toTensorVector();
    auto* module = reinterpret_cast<CheckpointedImpl*>(ctx->saved_data["module"].toInt());

    auto generator = at::detail::getDefaultCPUGenerator();
    auto rng_now = generator.get_state();
    generator.set_state(ctx->saved_data["rng"].toTensor());
    bool autocast_was = at::autocast::is_cpu_enabled();
    auto dtype_was = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(ctx->saved_data["autocast"].toBool());
    at::autocast::set_autocast_cpu_dtype(ctx->saved_data["autocast_dtype"].toScalarType());
    torch::Tensor y;
    {
      torch::AutoGradMode grad(true);
      y = module->forward_inner(x);
    }
    at::autocast::set_cpu_enabled(autocast_was);
    at::autocast::set_autocast_cpu_dtype(dtype_was);
    generator.set_state(rng_now);

    std::vector<torch::Tensor> wrt{x};
    wrt.insert(wrt.end(), params.begin(), params.end());
    auto grads = torch::autograd::grad({y}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    grads.emplace_back();  // the module pointer has no gradient
    return grads;
  }
};

}  // namespace

CheckpointedImpl::CheckpointedImpl(torch::nn::AnyModule inner) : inner_(std::move(inner)) {
  register_module("inner", inner_.ptr());
}

torch::Tensor CheckpointedImpl::forward_inner(const torch::Tensor& x) {
  return inner_.forward<torch::Tensor>(x);
}

torch::Tensor CheckpointedImpl::forward(const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled()) return forward_inner(x);
  std::vector<torch::Tensor> params;
  for (const auto& p : parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  return CheckpointFunction::apply(x, at::TensorList(params), this)[0];
}

void checkpoint_layers(torch::nn::Sequential& model, const std::vector<int64_t>& indices) {
  torch::nn::Sequential rebuilt;
  std::vector<bool> wrap(model->size(), false);
  for (int64_t i : indices) {
    if (i < 0 || i >= static_cast<int64_t>(model->size())) {
      throw UsageError("checkpoint-layers", "layer index " + std::to_string(i) + " is out of range (model has " +
                                                std::to_string(model->size()) + " layers)");
    }
    wrap[i] = true;
  }
  size_t i = 0;
  for (const auto& layer : *model) {
    if (wrap[i++]) {
      rebuilt->push_back(Checkpointed(layer));
    } else {
      rebuilt->push_back(layer);
    }
  }
  model = rebuilt;
}

}  // namespace afterburner::train
