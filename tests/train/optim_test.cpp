#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "afterburner/core/error.h"
#include "afterburner/train/optim.h"
#include "testing.h"

namespace afterburner::train {
namespace {

// Learning rates that Python PyTorch's own schedulers produce, as the independent reference.
std::vector<double> python_schedule(const std::string& scheduler, int64_t steps) {
  testing::TempDir dir;
  auto script = dir / "schedule.py";
  testing::write_file(script,
                      "import json, sys, torch\n"
                      "opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n"
                      "sched = " + scheduler + "\n"
                      "lrs = []\n"
                      "for _ in range(" + std::to_string(steps) + "):\n"
                      "    lrs.append(opt.param_groups[0]['lr'])\n"
                      "    opt.step()\n"
                      "    sched.step()\n"
                      "print(json.dumps(lrs))\n");
  auto result = testing::run({"/usr/bin/python3", script.string()});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return nlohmann::json::parse(result.out).get<std::vector<double>>();
}

void expect_schedule(const LrSchedule& ours, const std::vector<double>& reference) {
  for (size_t s = 0; s < reference.size(); ++s) {
    EXPECT_NEAR(ours.lr_at(static_cast<int64_t>(s)), reference[s], 1e-9 + 1e-7 * reference[s]) << "step " << s;
  }
}

}  // namespace

TEST(LrSchedule, OneCycleMatchesPyTorch) {
  expect_schedule(LrSchedule(ScheduleOptions().kind("onecycle"), 0.1, 100),
                  python_schedule("torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)", 100));
}

TEST(LrSchedule, StepMatchesPyTorch) {
  expect_schedule(LrSchedule(ScheduleOptions().kind("step").step_size(7).gamma(0.5), 0.1, 40),
                  python_schedule("torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)", 40));
}

TEST(LrSchedule, CosineWithoutWarmupMatchesPyTorch) {
  expect_schedule(LrSchedule(ScheduleOptions().kind("cosine"), 0.1, 50),
                  python_schedule("torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)", 50));
}

TEST(LrSchedule, CosineWarmupRampsLinearlyThenDecays) {
  LrSchedule schedule(ScheduleOptions().kind("cosine").warmup_steps(10), 0.1, 110);
  EXPECT_DOUBLE_EQ(schedule.lr_at(0), 0.01);
  EXPECT_DOUBLE_EQ(schedule.lr_at(4), 0.05);
  EXPECT_DOUBLE_EQ(schedule.lr_at(10), 0.1);
  EXPECT_NEAR(schedule.lr_at(60), 0.05, 1e-12);  // half-way through the decay
  EXPECT_NEAR(schedule.lr_at(110), 0.0, 1e-12);
}

// A run shorter than the warm-up (--max-steps 50 with the default 100) never reaches the peak
// and never decays; the schedule line says so rather than "over 0 steps".
TEST(LrSchedule, ARunWithinTheWarmupIsDescribedAsWarmupOnly) {
  LrSchedule shorter(ScheduleOptions().kind("cosine").warmup_steps(100), 0.1, 50);
  EXPECT_DOUBLE_EQ(shorter.lr_at(49), 0.05);
  EXPECT_EQ(shorter.describe(),
            "warm-up only: the run's 50 steps are the first 50 of 100 warm-up steps towards lr 0.1, so the lr rises "
            "linearly from 0.001 to only 0.05 and the cosine to 0 never starts");
  LrSchedule as_long(ScheduleOptions().kind("cosine").warmup_steps(50), 0.1, 50);
  EXPECT_DOUBLE_EQ(as_long.lr_at(49), 0.1);
  EXPECT_EQ(as_long.describe(),
            "warm-up only: the run's 50 steps are all warm-up, so the lr rises linearly from 0.002 to 0.1 and the "
            "cosine to 0 never starts");
  EXPECT_EQ(LrSchedule(ScheduleOptions().kind("cosine").warmup_steps(10), 0.1, 50).describe(),
            "cosine from 0.1 to 0 over 40 steps after 10 warm-up steps");
}

TEST(LrSchedule, UnknownKindIsAUsageError) {
  EXPECT_THROW(LrSchedule(ScheduleOptions().kind("exponential"), 0.1, 10), UsageError);
}

// One SGD step with momentum and Nesterov, computed by hand in double precision.
TEST(Optimizer, SgdNesterovFollowsTheUpdateRule) {
  auto w = torch::tensor({1.0, -2.0}, torch::kDouble).requires_grad_();
  auto opt = make_optimizer(OptimizerOptions().kind("sgd").lr(0.1).momentum(0.9).nesterov(true).weight_decay(0.01),
                            {w});
  std::vector<double> expected{1.0, -2.0}, velocity{0, 0};
  for (int step = 0; step < 3; ++step) {
    opt->zero_grad();
    (w * w).sum().backward();  // gradient 2w
    opt->step();
    for (int i = 0; i < 2; ++i) {
      double g = 2 * expected[i] + 0.01 * expected[i];
      velocity[i] = step == 0 ? g : 0.9 * velocity[i] + g;
      expected[i] -= 0.1 * (g + 0.9 * velocity[i]);
    }
  }
  EXPECT_NEAR(w[0].item<double>(), expected[0], 1e-12);
  EXPECT_NEAR(w[1].item<double>(), expected[1], 1e-12);
}

TEST(Optimizer, AdamWDecouplesWeightDecay) {
  auto w = torch::tensor({3.0}, torch::kDouble).requires_grad_();
  auto opt = make_optimizer(OptimizerOptions().kind("adamw").lr(0.01).weight_decay(0.1), {w});
  opt->zero_grad();
  (w * 0).sum().backward();  // zero gradient: only the decay moves the weight
  opt->step();
  EXPECT_NEAR(w.item<double>(), 3.0 * (1 - 0.01 * 0.1), 1e-12);
}

TEST(Optimizer, InvalidOptionsAreUsageErrors) {
  auto w = torch::zeros({1}, torch::requires_grad());
  EXPECT_THROW(make_optimizer(OptimizerOptions().kind("lion"), {w}), UsageError);
  EXPECT_THROW(make_optimizer(OptimizerOptions().lr(0), {w}), UsageError);
  EXPECT_THROW(make_optimizer(OptimizerOptions().momentum(0).nesterov(true), {w}), UsageError);
}

}  // namespace afterburner::train
