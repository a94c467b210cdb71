#include "afterburner/train/optim.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "afterburner/core/error.h"
#include "afterburner/kernels/flat_optim.h"

namespace afterburner::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& o,
                                                        const std::vector<torch::Tensor>& params) {
  if (!(o.lr() > 0)) throw UsageError("lr", "must be positive (got " + std::to_string(o.lr()) + ")");
  if (o.weight_decay() < 0) throw UsageError("weight-decay", "must not be negative");
  if (o.kind() == "sgd") {
    if (o.nesterov() && o.momentum() <= 0) throw UsageError("nesterov", "needs momentum > 0");
    auto options = torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).nesterov(o.nesterov())
                       .weight_decay(o.weight_decay());
    if (o.fused()) return std::make_unique<kernels::FlatSGD>(params, options);
    return std::make_unique<torch::optim::SGD>(params, options);
  }
  if (o.kind() == "adamw") {
    auto options = torch::optim::AdamWOptions(o.lr()).betas({o.beta1(), o.beta2()}).eps(o.eps())
                       .weight_decay(o.weight_decay());
    if (o.fused()) return std::make_unique<kernels::FlatAdamW>(params, options);
    return std::make_unique<torch::optim::AdamW>(params, options);
  }
  throw UsageError("optimizer", "unknown optimizer '" + o.kind() + "' (expected sgd or adamw)");
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

LrSchedule::LrSchedule(ScheduleOptions options, double base_lr, int64_t total_steps)
    : options_(std::move(options)), base_lr_(base_lr), total_steps_(std::max<int64_t>(total_steps, 1)) {
  const auto& k = options_.kind();
  if (k != "constant" && k != "cosine" && k != "onecycle" && k != "step") {
    throw UsageError("schedule", "unknown schedule '" + k + "' (expected constant, cosine, onecycle or step)");
  }
  if (options_.step_size() <= 0) throw UsageError("step-size", "must be positive");
}

// cosine:   warm-up w: lr = base * (s+1)/w for s < w; then
//           lr = final + (base - final) * (1 + cos(pi * (s-w)/(T-w))) / 2
// onecycle: rises from base/div to base over pct_start*T steps, then falls to
//           base/(div*final_div), both halves cosine-annealed (as torch's OneCycleLR)
// step:     lr = base * gamma^floor(s / step_size)
double LrSchedule::lr_at(int64_t step) const {
  const double pi = 3.14159265358979323846;
  auto cosine = [&](double from, double to, double t) { return to + (from - to) * (1 + std::cos(pi * t)) / 2; };
  const auto& k = options_.kind();
  if (k == "constant") return base_lr_;
  if (k == "step") return base_lr_ * std::pow(options_.gamma(), step / options_.step_size());
  if (k == "cosine") {
    int64_t warmup = options_.warmup_steps();
    if (step < warmup) return base_lr_ * double(step + 1) / double(warmup);
    double span = double(std::max<int64_t>(total_steps_ - warmup, 1));
    double t = std::min(1.0, double(step - warmup) / span);
    return cosine(base_lr_, base_lr_ * options_.final_lr_fraction(), t);
  }
  double start = base_lr_ / options_.div_factor();
  double end = start / options_.final_div_factor();
  double peak_step = std::max(1.0, options_.pct_start() * double(total_steps_) - 1);
  if (step <= peak_step) return cosine(start, base_lr_, double(step) / peak_step);
  double t = std::min(1.0, (double(step) - peak_step) / std::max(1.0, double(total_steps_ - 1) - peak_step));
  return cosine(base_lr_, end, t);
}

std::string LrSchedule::describe() const {
  const auto& o = options_;
  if (o.kind() == "constant") return fmt::format("constant {}", base_lr_);
  if (o.kind() == "step") return fmt::format("step: {} times {} every {} steps", base_lr_, o.gamma(), o.step_size());
  if (o.kind() == "cosine" && o.warmup_steps() >= total_steps_) {
    // The run ends within the warm-up: say what the learning rate does, not a decay of 0 steps.
    const std::string steps = o.warmup_steps() == total_steps_
                                  ? "are all warm-up"
                                  : fmt::format("are the first {} of {} warm-up steps towards lr {}", total_steps_,
                                                o.warmup_steps(), base_lr_);
    return fmt::format("warm-up only: the run's {} steps {}, so the lr rises linearly from {:.3g} to {}{:.3g} and the "
                       "cosine to {} never starts",
                       total_steps_, steps, lr_at(0), o.warmup_steps() == total_steps_ ? "" : "only ",
                       lr_at(total_steps_ - 1), base_lr_ * o.final_lr_fraction());
  }
  if (o.kind() == "cosine") {
    return fmt::format("cosine from {} to {} over {} steps after {} warm-up steps", base_lr_,
                       base_lr_ * o.final_lr_fraction(), total_steps_ - o.warmup_steps(), o.warmup_steps());
  }
  return fmt::format("onecycle over {} steps: {} up to {} in the first {:.0f}%, then down to {:.3g}", total_steps_,
                     base_lr_ / o.div_factor(), base_lr_, 100 * o.pct_start(), lr_at(total_steps_ - 1));
}

void LrSchedule::apply(torch::optim::Optimizer& optimizer, int64_t step) const {
  set_lr(optimizer, lr_at(step));
}

}  // namespace afterburner::train
