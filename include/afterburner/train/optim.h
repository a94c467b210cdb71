// Optimizers by name and learning-rate schedules.
//
//   auto opt = afterburner::train::make_optimizer(
//       OptimizerOptions().kind("sgd").lr(0.05).momentum(0.9).nesterov(true), model->parameters());
//   LrSchedule schedule(ScheduleOptions().kind("cosine").warmup_steps(100), /*base_lr=*/0.05,
//                       /*total_steps=*/4680);
//   for (int64_t step = 0; step < total; ++step) {
//     schedule.apply(*opt, step);     // sets every group's lr for this step
//     ...
//   }
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

namespace afterburner::train {

struct OptimizerOptions {
  TORCH_ARG(std::string, kind) = "sgd";  // "sgd" | "adamw"
  TORCH_ARG(double, lr) = 0.05;
  TORCH_ARG(double, momentum) = 0.9;     // sgd
  TORCH_ARG(bool, nesterov) = false;     // sgd
  TORCH_ARG(double, weight_decay) = 5e-4;
  TORCH_ARG(double, beta1) = 0.9;        // adamw
  TORCH_ARG(double, beta2) = 0.999;      // adamw
  TORCH_ARG(double, eps) = 1e-8;         // adamw
  TORCH_ARG(bool, fused) = false;        // one pass over flat buffers (kernels::FlatSGD/FlatAdamW)
};

// UsageError for an unknown kind or an invalid value (lr <= 0, nesterov without momentum).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        const std::vector<torch::Tensor>& params);

void set_lr(torch::optim::Optimizer& optimizer, double lr);

struct ScheduleOptions {
  TORCH_ARG(std::string, kind) = "cosine";  // "constant" | "cosine" | "onecycle" | "step"
  TORCH_ARG(int64_t, warmup_steps) = 0;     // cosine: linear ramp from 0 first
  TORCH_ARG(double, final_lr_fraction) = 0.0;  // cosine: lr at the end, as a fraction of base
  TORCH_ARG(double, pct_start) = 0.3;       // onecycle: fraction of steps spent rising
  TORCH_ARG(double, div_factor) = 25.0;     // onecycle: start lr = base / div_factor
  TORCH_ARG(double, final_div_factor) = 1e4;  // onecycle: end lr = start lr / final_div_factor
  TORCH_ARG(int64_t, step_size) = 1000;     // step: multiply by gamma every step_size steps
  TORCH_ARG(double, gamma) = 0.1;           // step
};

// A schedule is a pure function of the step, so resuming needs only the step number.
class LrSchedule {
 public:
  LrSchedule(ScheduleOptions options, double base_lr, int64_t total_steps);
  double lr_at(int64_t step) const;
  // E.g. "cosine from 0.1 to 0 over 1266 steps after 100 warm-up steps"; a run no longer than
  // its warm-up is "warm-up only: ...", with the learning rate it reaches.
  std::string describe() const;
  void apply(torch::optim::Optimizer& optimizer, int64_t step) const;

 private:
  ScheduleOptions options_;
  double base_lr_;
  int64_t total_steps_;
};

}  // namespace afterburner::train
