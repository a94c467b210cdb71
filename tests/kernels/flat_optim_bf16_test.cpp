// FlatOptimizer's bf16 copies (train::Bf16Weights' half): a step that takes a copy's bf16
// gradient moves its float32 parameter exactly as the same optimizer moves it when given that
// gradient widened to float32 (autocast's backward), the copy is LibTorch's cast of the stepped
// parameter bit for bit (ties to even, NaN and infinities included), the gradient read is left
// as it was, and copies follow parameters changed outside a step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/kernels/flat_optim.h"
#include "testing.h"

namespace afterburner::kernels {
namespace {

using Params = std::vector<torch::Tensor>;

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto bits = a.scalar_type() == torch::kBFloat16 ? torch::kInt16 : torch::kInt32;
  return torch::equal(a.contiguous().view(bits), b.contiguous().view(bits));
}

// A channels_last convolution weight, an odd-sized vector and one larger than a parallel chunk,
// so that steps split parameters across threads.
Params make_params() {
  torch::manual_seed(11);
  return {torch::randn({8, 3, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(),
          torch::randn({37}).requires_grad_(), torch::randn({70001}).requires_grad_()};
}

Params clones(const Params& params) {
  Params out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

template <typename Optimizer, typename Options>
std::unique_ptr<FlatOptimizer> make(const Params& params, const Options& options) {
  return std::make_unique<Optimizer>(params, options);
}

// bf16 gradients for step `step`, each in its parameter's layout or contiguous.
Params bf16_gradients(const Params& params, int step, bool contiguous) {
  torch::manual_seed(100 + step);
  Params grads;
  for (const auto& p : params) {
    auto g = torch::randn(p.sizes()).to(torch::kBFloat16);
    grads.push_back(contiguous ? g : g.contiguous(p.suggest_memory_format()));
  }
  return grads;
}

using Factory = std::function<std::unique_ptr<FlatOptimizer>(const Params&)>;

// Steps `steps` times with copies (their gradients set) and without (the widened gradients set
// on the parameters), and checks parameters, copies and the gradients read after each step.
void check_against_float_gradients(const Factory& factory, bool contiguous_gradients) {
  const Params with = make_params(), without = clones(with);
  auto copied = factory(with), plain = factory(without);
  Params copies;
  for (const auto& p : with) copies.push_back(copied->bf16_copy(p));
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_EQ(copies[i].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(copies[i].is_leaf() && copies[i].requires_grad());
    EXPECT_EQ(copies[i].strides(), with[i].strides()) << "copy " << i << " keeps its parameter's layout";
    EXPECT_TRUE(same_bits(copies[i], with[i].detach().to(torch::kBFloat16))) << "copy " << i;
    EXPECT_TRUE(copied->bf16_copy(with[i]).is_same(copies[i])) << "one copy per parameter";
  }
  for (int step = 0; step < 5; ++step) {
    copied->zero_grad();
    plain->zero_grad();
    const Params grads = bf16_gradients(with, step, contiguous_gradients);
    Params kept;
    for (size_t i = 0; i < with.size(); ++i) {
      copies[i].mutable_grad() = grads[i];
      kept.push_back(grads[i].clone());
      without[i].mutable_grad() = grads[i].to(torch::kFloat);
    }
    copied->step();
    plain->step();
    for (size_t i = 0; i < with.size(); ++i) {
      EXPECT_TRUE(same_bits(with[i], without[i])) << "parameter " << i << " at step " << step;
      EXPECT_TRUE(same_bits(copies[i], with[i].detach().to(torch::kBFloat16))) << "copy " << i << " at step " << step;
      EXPECT_TRUE(same_bits(grads[i], kept[i])) << "the gradient read is left as it was";
      EXPECT_FALSE(copies[i].grad().defined()) << "the step used the copy's gradient up";
    }
  }
}

TEST(Bf16Copies, SgdStepsAsWithTheWidenedGradients) {
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4);
  for (bool contiguous : {false, true}) {
    check_against_float_gradients([&](const Params& p) { return make<FlatSGD>(p, options); }, contiguous);
  }
  check_against_float_gradients([](const Params& p) { return make<FlatSGD>(p, torch::optim::SGDOptions(0.05)); },
                                false);
}

TEST(Bf16Copies, AdamWStepsAsWithTheWidenedGradients) {
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  check_against_float_gradients([&](const Params& p) { return make<FlatAdamW>(p, options); }, false);
}

// Values whose bf16 rounding is a tie (to even), that overflow bf16, subnormals, signed zeros,
// infinities and NaNs with payloads: the copy holds what Tensor::to(kBFloat16) gives, after
// creation and after a step (lr 0, which turns infinities into NaN as torch's SGD does: 0 * inf).
TEST(Bf16Copies, CopiesRoundAsLibTorchsCast) {
  auto values = torch::tensor({1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -1.0f - 0x1p-8f, 3.4e38f, -3.4e38f, 1e-40f, -0.0f, 0.0f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()});
  const auto nans = torch::tensor({0x7FC00000, 0x7F800001, static_cast<int32_t>(0xFFC00123u)}, torch::kInt32);
  values = torch::cat({values, nans.view(torch::kFloat), torch::randn({1000}) * 1e3}).requires_grad_();
  FlatSGD optimizer({values}, torch::optim::SGDOptions(0.0));
  const torch::Tensor copy = optimizer.bf16_copy(values);
  EXPECT_TRUE(same_bits(copy, values.detach().to(torch::kBFloat16)));
  copy.mutable_grad() = torch::ones_like(copy);
  optimizer.step();
  EXPECT_TRUE(same_bits(copy, values.detach().to(torch::kBFloat16))) << "rewritten by the step's own rounding";
}

// A weight its forward reads only now and then: without a gradient anywhere a parameter is skipped
// as the plain optimizer skips it; after its copy had one, steps without one step on a zero
// gradient, as the plain optimizer's flat gradient, once defined, stays defined and zeroed.
TEST(Bf16Copies, StepsWithoutAGradientOnTheCopyAsThePlainOptimizer) {
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.1);
  const Params with = make_params(), without = clones(with);
  FlatSGD copied(with, options), plain(without, options);
  const torch::Tensor copy = copied.bf16_copy(with[1]);
  for (int step = 0; step < 4; ++step) {
    copied.zero_grad();
    plain.zero_grad();
    for (size_t i = 0; i < with.size(); ++i) {
      const auto grad = torch::randn(with[i].sizes()).contiguous(with[i].suggest_memory_format());
      if (i != 1) {  // added in place once defined, as backward does: zero_grad must have zeroed them
        for (const auto& p : {with[i], without[i]}) {
          p.grad().defined() ? void(p.mutable_grad().add_(grad)) : void(p.mutable_grad() = grad.clone());
        }
      } else if (step == 1) {  // step 0 reads no weight 1; step 1 does; steps 2 and 3 do not
        copy.mutable_grad() = grad.to(torch::kBFloat16);
        without[i].mutable_grad() = copy.grad().to(torch::kFloat);
      }
    }
    copied.step();
    plain.step();
    for (size_t i = 0; i < with.size(); ++i) EXPECT_TRUE(same_bits(with[i], without[i])) << i << " at " << step;
    EXPECT_TRUE(same_bits(copy, with[1].detach().to(torch::kBFloat16)));
  }
}

TEST(Bf16Copies, ZeroGradDropsTheCopiesGradients) {
  const Params params = make_params();
  FlatSGD optimizer(params, torch::optim::SGDOptions(0.1));
  const torch::Tensor copy = optimizer.bf16_copy(params[0]);
  copy.mutable_grad() = torch::ones_like(copy);
  optimizer.zero_grad();
  EXPECT_FALSE(copy.grad().defined());
}

// Changed outside a step: in place (a checkpoint's copy_), or moved to other storage
// (Module::load's set_): refresh_bf16_copies() rewrites the copy, and the next step steps the
// new values.
TEST(Bf16Copies, CopiesFollowParametersChangedOutsideASteps) {
  const Params params = make_params();
  FlatSGD optimizer(params, torch::optim::SGDOptions(0.1));
  const torch::Tensor in_place = optimizer.bf16_copy(params[1]), moved = optimizer.bf16_copy(params[2]);
  const torch::Tensor loaded = torch::randn({37}), replacement = torch::randn({70001});
  {
    torch::NoGradGuard no_grad;
    params[1].copy_(loaded);
    params[2].set_data(replacement.clone());
  }
  optimizer.refresh_bf16_copies();
  EXPECT_TRUE(same_bits(in_place, loaded.to(torch::kBFloat16)));
  EXPECT_TRUE(same_bits(moved, replacement.to(torch::kBFloat16)));
  moved.mutable_grad() = torch::zeros({70001}, torch::kBFloat16);
  optimizer.step();  // lr 0.1 times a zero gradient: the replacement's values stay
  EXPECT_TRUE(same_bits(params[2], replacement));
  EXPECT_TRUE(same_bits(moved, replacement.to(torch::kBFloat16)));
}

TEST(Bf16Copies, OnlyForTheOptimizersParameters) {
  const Params params = make_params();
  FlatSGD optimizer(params, torch::optim::SGDOptions(0.1));
  const std::string message = testing::error_message<UsageError>([&] { optimizer.bf16_copy(torch::randn({3})); });
  EXPECT_TRUE(testing::Contains(message, "FlatSGD bf16_copy")) << message;
  EXPECT_TRUE(testing::Contains(message, "not one of this optimizer's parameters")) << message;
}

}  // namespace
}  // namespace afterburner::kernels
