#include "afterburner/train/precision.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"

namespace afterburner::train {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "fp16") return Precision::fp16;
  throw UsageError("--precision", "unknown precision '" + name + "' (expected fp32, bf16 or fp16)");
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

void check_precision_supported(Precision precision, const torch::Device& device) {
  if (precision == Precision::fp16 && device.is_cpu()) {
    throw UsageError("--precision", "fp16 is not supported on CPU by LibTorch's autocast; use bf16 "
                                  "(same range as fp32, no loss scaling needed) or fp32");
  }
}

AutocastGuard::AutocastGuard(Precision precision, const torch::Device& device) {
  if (precision == Precision::fp32) return;
  check_precision_supported(precision, device);
  active_ = true;
  cuda_ = device.is_cuda();
  auto dtype = precision == Precision::bf16 ? at::kBFloat16 : at::kHalf;
  if (cuda_) {
    previous_enabled_ = at::autocast::is_enabled();
    previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  } else {
    previous_enabled_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
  }
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The weight cast cache lives until the outermost autocast region ends.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (cuda_) {
    at::autocast::set_enabled(previous_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_cpu_enabled(previous_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }
}

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(options.init_scale()) {}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return enabled() ? loss * scale_ : loss;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!enabled() || unscaled_) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  if (!grads.empty()) {
    // One fused reduction over all gradients: the sum is non-finite iff some entry is.
    auto inv = 1.0 / scale_;
    torch::Tensor total = torch::zeros({}, torch::kDouble);
    for (auto& g : grads) {
      g.mul_(inv);
      total += g.sum(torch::kDouble);
    }
    found_inf_ = !std::isfinite(total.item<double>());
  }
  unscaled_ = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!enabled()) {
    optimizer.step();
    return true;
  }
  unscale(optimizer);
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!enabled()) return;
  if (found_inf_) {
    scale_ *= options_.backoff_factor();
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scaler.scale", torch::tensor(scale_, torch::kDouble));
  archive.write("scaler.growth_tracker", torch::tensor(growth_tracker_, torch::kLong));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, tracker;
  archive.read("scaler.scale", scale);
  archive.read("scaler.growth_tracker", tracker);
  scale_ = scale.item<double>();
  growth_tracker_ = tracker.item<int64_t>();
}

}  // namespace afterburner::train
