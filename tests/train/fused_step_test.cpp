// Training on the same footing: a step of `afterburner train`'s default fused path (kernels::fuse,
// kernels::cross_entropy, the flat optimizer, driven by the Trainer) against LibTorch's unfused
// step on a copy of the same model (torch's own layers, cross_entropy and optimizer), step by
// step over the batches a Loader yields with drop_last off: batches of one row, a normal
// batch twice, then the odd last batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "afterburner/data/dataset.h"
#include "afterburner/data/loader.h"
#include "afterburner/kernels/cross_entropy.h"
#include "afterburner/kernels/fuse.h"
#include "afterburner/models/zoo.h"
#include "afterburner/train/config.h"
#include "afterburner/train/optim.h"
#include "afterburner/train/precision.h"
#include "afterburner/train/trainer.h"

namespace afterburner::train {
namespace {

using Named = std::map<std::string, torch::Tensor>;

// Loss, gradients and BatchNorm statistics: relative error in the max norm,
// max |fused - LibTorch| / max |LibTorch|. In fp32 the two differ only in summation order; under
// bf16 autocast also in where the fused ops round to bf16.
double tolerance(Precision precision) { return precision == Precision::fp32 ? 1e-5 : 2e-2; }
// Parameters after the step, relative to the largest update: both optimizers compute in float32
// from the same parameters and gradients and differ only in rounding.
constexpr double kStepTolerance = 1e-5;
// Plus one float32 ulp of the largest parameter, as each side rounds its result to float32.
constexpr double kFloatUlp = 1.0 / (1 << 23);

// The optimizer settings `afterburner train` uses by default (TrainConfig), for `kind`.
OptimizerOptions default_optimizer(const std::string& kind) {
  const TrainConfig defaults;
  return OptimizerOptions()
      .kind(kind)
      .lr(defaults.lr)
      .momentum(defaults.momentum)
      .nesterov(defaults.nesterov)
      .weight_decay(defaults.weight_decay);
}

// LibTorch's own optimizer with the same settings.
std::unique_ptr<torch::optim::Optimizer> torch_optimizer(const OptimizerOptions& o,
                                                         const std::vector<torch::Tensor>& params) {
  if (o.kind() == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).nesterov(o.nesterov())
                    .weight_decay(o.weight_decay()));
  }
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(o.lr()).betas({o.beta1(), o.beta2()}).eps(o.eps())
                  .weight_decay(o.weight_decay()));
}

// Gives `to` the parameter and buffer values of `from`, bit for bit.
void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto params = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(params[p.key()]);
  auto buffers = from.named_buffers();
  for (auto& b : to.named_buffers()) b.value().copy_(buffers[b.key()]);
}

Named parameters_of(const torch::nn::Module& model) {
  Named out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

Named gradients_of(const torch::nn::Module& model) {
  Named out;
  for (const auto& p : model.named_parameters()) {
    out[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
  }
  return out;
}

Named buffers_of(const torch::nn::Module& model) {
  Named out;
  for (const auto& b : model.named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

double max_abs(const torch::Tensor& tensor) { return tensor.abs().max().item<double>(); }

// The difference `actual` - `expected` a tensor may show, given its name and expected value.
using Allowance = std::function<double(const std::string&, const torch::Tensor&)>;

Allowance relative_to_largest(double tolerance) {
  return [tolerance](const std::string&, const torch::Tensor& expected) { return tolerance * max_abs(expected); };
}

// Checks that both hold the same names and shapes, and for every floating-point tensor that
// max |actual - expected| <= allowance; integer tensors (num_batches_tracked) must be equal.
void expect_close(const Named& actual, const Named& expected, const std::string& what, const Allowance& allowance) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (const auto& [name, e] : expected) {
    ASSERT_TRUE(actual.count(name)) << what << " " << name << " is missing";
    const auto& a = actual.at(name);
    ASSERT_TRUE(a.defined() && e.defined()) << what << " " << name << " is undefined";
    ASSERT_EQ(a.sizes(), e.sizes()) << what << " " << name;
    if (!e.is_floating_point()) {
      EXPECT_TRUE(torch::equal(a, e)) << what << " " << name << ": " << a << " vs " << e;
      continue;
    }
    const double difference = max_abs(a.to(torch::kDouble) - e.to(torch::kDouble));
    const double allowed = allowance(name, e);
    EXPECT_LE(difference, allowed) << what << " " << name << ": largest difference " << difference << ", "
                                   << difference / max_abs(e) << " of the largest value";
  }
}

// Random images [n, 1, 28, 28] and labels, batched as `afterburner train` batches them
// (shuffled, drop_last off, so the last batch holds what is left).
data::Loader loader_over(int64_t samples, int64_t batch_size) {
  torch::manual_seed(11);
  auto dataset = std::make_shared<data::TensorDataset>(torch::randn({samples, 1, 28, 28}),
                                                       torch::randint(0, 10, {samples}, torch::kLong));
  return data::Loader(dataset, data::LoaderOptions().batch_size(batch_size).workers(0).drop_last(false).seed(5));
}

// The trainer `afterburner train` builds by default (see run_training), on `model`, with a
// constant learning rate (the schedule is not what these tests compare).
Trainer fused_trainer(const torch::nn::Sequential& model, const OptimizerOptions& optimizer, Precision precision,
                      data::Loader& loader) {
  auto fused = kernels::fuse(model).model;
  return Trainer(fused, make_optimizer(OptimizerOptions(optimizer).fused(true), fused->parameters()),
                 LrSchedule(ScheduleOptions().kind("constant"), optimizer.lr(), loader.batches_per_epoch()), loader,
                 loader, TrainerOptions().loss(kernels::cross_entropy).precision(precision));
}

// LibTorch's unfused step, as a user writes it. The optimizer steps on the gradients it is
// given (see the test below for why).
struct TorchStep {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Precision precision;

  double forward_backward(const data::Batch& batch) {
    torch::Tensor loss;
    {
      AutocastGuard autocast(precision);
      loss = torch::nn::functional::cross_entropy(model->forward(batch.input), batch.target);
    }
    loss.backward();
    return loss.item<double>();
  }

  void optimizer_step(const Named& gradients) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->named_parameters()) p.value().mutable_grad().copy_(gradients.at(p.key()));
    }
    optimizer->step();
    optimizer->zero_grad();
  }
};

// An epoch of `samples` random samples in batches of `batch_size`.
struct Epoch {
  int64_t samples, batch_size;
};
using StepCase = std::tuple<std::string /*model*/, std::string /*optimizer*/, Precision, Epoch>;

class FusedStep : public ::testing::TestWithParam<StepCase> {};

// Each step starts LibTorch from the fused side's state, bit for bit (parameters and BatchNorm
// statistics), and compares the loss, every gradient, the parameters after the optimizer step and
// the BatchNorm statistics; LibTorch's optimizer then steps on the fused gradients, once they
// matched its own. The fused side runs its steps undisturbed, as in training. Left to drift
// apart, the two would soon differ for reasons that are no defect: after a step of AdamW at
// lr 0.05, one-ulp differences in resnet's parameters change its gradients by 1e-3, and AdamW's
// update, about lr * g / (|g| + eps), turns the 3e-10 that summation order changes in a
// gradient of 1e-9 into updates 2% of lr apart.
TEST_P(FusedStep, MatchesLibTorchsUnfusedStep) {
  const auto& [model_name, optimizer_kind, precision, epoch] = GetParam();
  const double tol = tolerance(precision);
  torch::manual_seed(3);
  auto model = models::make_model(model_name);
  auto loader = loader_over(epoch.samples, epoch.batch_size);
  const auto optimizer = default_optimizer(optimizer_kind);
  Trainer fused = fused_trainer(model, optimizer, precision, loader);
  auto copy = models::make_model(model_name);
  TorchStep reference{copy, torch_optimizer(optimizer, copy->parameters()), precision};

  int64_t step = 0;
  for (auto& batch : loader.epoch(0)) {
    SCOPED_TRACE("step " + std::to_string(step) + ", batch of " + std::to_string(batch.target.size(0)));
    const auto input = batch.input.clone(), target = batch.target.clone();
    copy_state(*model, *copy);
    const Named before = parameters_of(*model);

    const double fused_loss = fused.forward_backward(batch);
    const double reference_loss = reference.forward_backward(batch);
    EXPECT_NEAR(fused_loss, reference_loss, tol * std::abs(reference_loss));
    const Named fused_gradients = gradients_of(*model);
    expect_close(fused_gradients, gradients_of(*copy), "gradient of", relative_to_largest(tol));

    EXPECT_TRUE(fused.optimizer_step());
    reference.optimizer_step(fused_gradients);
    expect_close(parameters_of(*model), parameters_of(*copy), "after the step, parameter",
                 [&](const std::string& name, const torch::Tensor& after) {
                   return kStepTolerance * max_abs(after - before.at(name)) + kFloatUlp * max_abs(after);
                 });
    expect_close(buffers_of(*model), buffers_of(*copy), "after the step, buffer", relative_to_largest(tol));

    EXPECT_TRUE(torch::equal(batch.input, input)) << "the step changed its input";
    EXPECT_TRUE(torch::equal(batch.target, target)) << "the step changed its labels";
    ++step;
  }
  EXPECT_EQ(step, (epoch.samples + epoch.batch_size - 1) / epoch.batch_size);
  EXPECT_EQ(fused.state().step, step);
}

std::string case_name(const ::testing::TestParamInfo<StepCase>& info) {
  const auto& [model, optimizer, precision, epoch] = info.param;
  return model + "_" + optimizer + "_" + to_string(precision) + "_" + std::to_string(epoch.samples) + "_samples_by_" +
         std::to_string(epoch.batch_size);
}

// 2 samples by 1: two batches of one row; 45 by 16: batches of 16, 16 and the odd last 13.
INSTANTIATE_TEST_SUITE_P(Zoo, FusedStep,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "resnet"), ::testing::Values("sgd", "adamw"),
                                            ::testing::Values(Precision::fp32, Precision::bf16),
                                            ::testing::Values(Epoch{2, 1}, Epoch{45, 16})),
                         case_name);

}  // namespace
}  // namespace afterburner::train


