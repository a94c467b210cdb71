#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include "afterburner/core/error.h"
#include "afterburner/kernels/flat_optim.h"
#include "testing.h"

namespace afterburner::kernels {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::SGDOptions;
using Params = std::vector<torch::Tensor>;

// A small MLP plus a stand-alone parameter; equal values on every call.
struct Net {
  torch::nn::Sequential layers;
  torch::Tensor extra;  // gets no gradient on every third step, the first included

  Params parameters() const {
    Params params = layers->parameters();
    params.push_back(extra);
    return params;
  }
  torch::Tensor loss(const torch::Tensor& input) { return layers->forward(input).pow(2).sum() + extra.sum(); }
};

Net make_net() {
  torch::manual_seed(7);
  return {torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8),
                                torch::nn::ReLU(), torch::nn::Linear(8, 3)),
          torch::randn({2, 3, 2}).requires_grad_()};
}

// The gradients both optimizers get at `step`: seeded normals, none for the last parameter
// on every third step.
Params gradients_for(const Params& params, int step) {
  torch::manual_seed(1000 + step);
  Params grads;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool skipped = i + 1 == params.size() && step % 3 == 0;
    grads.push_back(skipped ? torch::Tensor() : torch::randn(params[i].sizes()));
  }
  return grads;
}

// Installs gradients either as new tensors (what backward does after zero_grad(set_to_none))
// or by writing into the existing ones (what it does after zero_grad()).
void feed(const Params& params, const Params& grads, bool in_place) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& grad = params[i].mutable_grad();
    if (!grads[i].defined()) {
      grad.reset();
    } else if (in_place && grad.defined()) {
      grad.copy_(grads[i]);
    } else {
      grad = grads[i].clone();
    }
  }
}

Params snapshot(const Params& params) {
  Params copies;
  for (const auto& p : params) copies.push_back(p.detach().clone());
  return copies;
}

double max_abs_diff(const Params& a, const Params& b) {
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
  return diff;
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(const Params&)>;
using BeforeStep = std::function<void(torch::optim::Optimizer&, int step)>;

struct Comparison {
  double max_diff;   // between the two optimizers' parameters at the end
  double travelled;  // how far the reference's parameters moved, so the comparison means something
};

// Steps a reference and a flat optimizer on equal nets with equal gradients.
Comparison run_side_by_side(const MakeOptimizer& make_reference, const MakeOptimizer& make_flat, int steps,
                            const BeforeStep& before_step = nullptr) {
  Net reference_net = make_net(), flat_net = make_net();
  const Params start = snapshot(reference_net.parameters());
  auto reference = make_reference(reference_net.parameters());
  auto flat = make_flat(flat_net.parameters());
  for (int step = 0; step < steps; ++step) {
    const Params grads = gradients_for(start, step);
    feed(reference_net.parameters(), grads, false);
    feed(flat_net.parameters(), grads, step % 2 == 1);
    if (before_step) {
      before_step(*reference, step);
      before_step(*flat, step);
    }
    reference->step();
    flat->step();
  }
  return {max_abs_diff(reference_net.parameters(), flat_net.parameters()),
          max_abs_diff(reference_net.parameters(), start)};
}

template <typename Optimizer, typename Options>
MakeOptimizer single_group(Options options) {
  return [options](const Params& params) { return std::make_unique<Optimizer>(params, options); };
}

torch::Tensor transposed_gradients_start() { return torch::arange(12, torch::kFloat).reshape({3, 4}).requires_grad_(); }

// Steps torch's SGD (momentum 0.9) from transposed_gradients_start() and `optimizer` over `weight`
// three times with equal gradients of other strides than the weight's; returns torch's weight.
torch::Tensor step_with_transposed_gradients(torch::optim::Optimizer& optimizer, const torch::Tensor& weight) {
  auto reference_weight = transposed_gradients_start();
  torch::optim::SGD reference({reference_weight}, SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor transposed = torch::randn({4, 3}).t();
    reference_weight.mutable_grad() = transposed.clone();
    weight.mutable_grad() = transposed;
    reference.step();
    optimizer.step();
    EXPECT_TRUE(torch::equal(weight.grad(), reference_weight.grad())) << "the gradient's values changed";
  }
  return reference_weight;
}

// sgd_step / adamw_step behind torch's Optimizer interface, keeping torch's per-parameter
// state as separate tensors, as the Python package's FlatSGD / FlatAdamW do.
class SeparateTensorsSGD : public torch::optim::Optimizer {
 public:
  SeparateTensorsSGD(const Params& params, const SGDOptions& options)
      : Optimizer({torch::optim::OptimizerParamGroup(params)}, std::make_unique<SGDOptions>(options)) {}

  torch::Tensor step(LossClosure = nullptr) override {
    torch::NoGradGuard no_grad;
    const auto& options = static_cast<const SGDOptions&>(param_groups_[0].options());
    Params params, grads, buffers;
    std::vector<bool> fresh;
    for (const auto& p : param_groups_[0].params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
      if (options.momentum() == 0) continue;
      auto& buffer = buffers_[p.unsafeGetTensorImpl()];
      fresh.push_back(!buffer.defined());
      if (!buffer.defined()) buffer = torch::empty_like(p);
      buffers.push_back(buffer);
    }
    sgd_step(params, grads, buffers, fresh, options);
    return {};
  }

 private:
  std::map<const c10::TensorImpl*, torch::Tensor> buffers_;
};

class SeparateTensorsAdamW : public torch::optim::Optimizer {
 public:
  SeparateTensorsAdamW(const Params& params, const AdamWOptions& options)
      : Optimizer({torch::optim::OptimizerParamGroup(params)}, std::make_unique<AdamWOptions>(options)) {}

  torch::Tensor step(LossClosure = nullptr) override {
    torch::NoGradGuard no_grad;
    Params params, grads, exp_avgs, exp_avg_sqs;
    std::vector<int64_t> steps;
    for (const auto& p : param_groups_[0].params()) {
      if (!p.grad().defined()) continue;
      auto& state = state_[p.unsafeGetTensorImpl()];
      if (!state.exp_avg.defined()) state = {torch::zeros_like(p), torch::zeros_like(p), 0};
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(state.exp_avg);
      exp_avg_sqs.push_back(state.exp_avg_sq);
      steps.push_back(++state.step);
    }
    adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps,
               static_cast<const AdamWOptions&>(param_groups_[0].options()));
    return {};
  }

 private:
  struct State {
    torch::Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
  };
  std::map<const c10::TensorImpl*, State> state_;
};

struct SgdCase {
  const char* name;
  SGDOptions options;
};

class FlatSgdMatchesTorch : public ::testing::TestWithParam<SgdCase> {};

TEST_P(FlatSgdMatchesTorch, Over100Steps) {
  const SGDOptions& options = GetParam().options;
  for (const auto& ours : {single_group<FlatSGD>(options), single_group<SeparateTensorsSGD>(options)}) {
    auto result = run_side_by_side(single_group<torch::optim::SGD>(options), ours, 100);
    EXPECT_LT(result.max_diff, 1e-6);
    EXPECT_GT(result.travelled, 0.1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, FlatSgdMatchesTorch,
    ::testing::Values(SgdCase{"plain", SGDOptions(0.01)}, SgdCase{"momentum", SGDOptions(0.01).momentum(0.9)},
                      SgdCase{"nesterov", SGDOptions(0.01).momentum(0.9).nesterov(true)},
                      SgdCase{"weight_decay", SGDOptions(0.01).momentum(0.9).weight_decay(5e-2)},
                      SgdCase{"dampening", SGDOptions(0.01).momentum(0.8).dampening(0.3).weight_decay(5e-4)}),
    [](const ::testing::TestParamInfo<SgdCase>& info) { return std::string(info.param.name); });

struct AdamWCase {
  const char* name;
  AdamWOptions options;
};

class FlatAdamWMatchesTorch : public ::testing::TestWithParam<AdamWCase> {};

TEST_P(FlatAdamWMatchesTorch, Over100Steps) {
  const AdamWOptions& options = GetParam().options;
  for (const auto& ours : {single_group<FlatAdamW>(options), single_group<SeparateTensorsAdamW>(options)}) {
    auto result = run_side_by_side(single_group<torch::optim::AdamW>(options), ours, 100);
    EXPECT_LT(result.max_diff, 1e-6);
    EXPECT_GT(result.travelled, 0.1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, FlatAdamWMatchesTorch,
    ::testing::Values(AdamWCase{"defaults", AdamWOptions(1e-2)},
                      AdamWCase{"no_weight_decay", AdamWOptions(1e-2).weight_decay(0)},
                      AdamWCase{"custom", AdamWOptions(3e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1)}),
    [](const ::testing::TestParamInfo<AdamWCase>& info) { return std::string(info.param.name); });

TEST(SeparateTensorsStep, GradientOfAnotherLayoutIsReadAsItsParameter) {
  auto weight = transposed_gradients_start();
  SeparateTensorsSGD separate({weight}, SGDOptions(0.1).momentum(0.9));
  EXPECT_TRUE(torch::allclose(step_with_transposed_gradients(separate, weight), weight, 0, 1e-6));
}

TEST(SeparateTensorsStep, RefusesWhatItCannotStep) {
  auto weight = torch::zeros({3}).requires_grad_();
  auto grad = torch::ones({3});
  auto message = testing::error_message<UsageError>([&] {
    torch::NoGradGuard no_grad;
    sgd_step({weight.to(torch::kDouble)}, {grad}, {}, {}, SGDOptions(0.1));
  });
  EXPECT_TRUE(testing::Contains(message, "sgd_step params[0]: expected a dense float32 CPU tensor, got Double"));
  message = testing::error_message<UsageError>([&] { sgd_step({weight}, {grad}, {}, {}, SGDOptions(0.1)); });
  EXPECT_TRUE(testing::Contains(message, "sgd_step params[0]: requires grad: step under torch.no_grad()"));
  torch::NoGradGuard no_grad;
  message = testing::error_message<UsageError>([&] { sgd_step({weight, weight}, {grad, grad}, {}, {}, SGDOptions(0.1)); });
  EXPECT_TRUE(testing::Contains(message, "sgd_step params[1]: is listed twice"));
  message = testing::error_message<UsageError>(
      [&] { sgd_step({weight}, {torch::ones({4})}, {}, {}, SGDOptions(0.1)); });
  EXPECT_TRUE(testing::Contains(message, "sgd_step grads[0]: has shape [4], its parameter [3]"));
  message = testing::error_message<UsageError>(
      [&] { sgd_step({weight}, {grad}, {torch::zeros({3, 1})}, {true}, SGDOptions(0.1).momentum(0.9)); });
  EXPECT_TRUE(testing::Contains(message, "sgd_step momentum_buffers[0]: has shape [3, 1]"));
  message = testing::error_message<UsageError>(
      [&] { adamw_step({weight}, {grad}, {torch::zeros({3})}, {torch::zeros({3})}, {0}, AdamWOptions()); });
  EXPECT_TRUE(testing::Contains(message, "adamw_step steps[0]: must be at least 1"));
  message = testing::error_message<UsageError>([&] { adamw_step({weight}, {grad}, {}, {}, {1}, AdamWOptions()); });
  EXPECT_TRUE(testing::Contains(message, "adamw_step exp_avgs: expected 1 tensors, one per parameter, got 0"));
}

TEST(FlatOptimizer, LearningRateSetThroughParamGroupsTakesEffect) {
  auto set_lr = [](torch::optim::Optimizer& optimizer, int step) {
    optimizer.param_groups()[0].options().set_lr(step % 10 < 5 ? 0.05 : 0.002);
  };
  auto sgd = run_side_by_side(single_group<torch::optim::SGD>(SGDOptions(1).momentum(0.9)),
                              single_group<FlatSGD>(SGDOptions(1).momentum(0.9)), 40, set_lr);
  EXPECT_LT(sgd.max_diff, 1e-6);
  auto adamw = run_side_by_side(single_group<torch::optim::AdamW>(AdamWOptions(1)),
                                single_group<FlatAdamW>(AdamWOptions(1)), 40, set_lr);
  EXPECT_LT(adamw.max_diff, 1e-6);

  Net net = make_net();
  FlatSGD optimizer(net.parameters(), SGDOptions(0.1));
  const Params before = snapshot(net.parameters());
  feed(net.parameters(), gradients_for(before, 1), false);
  optimizer.param_groups()[0].options().set_lr(0);
  optimizer.step();
  EXPECT_EQ(max_abs_diff(net.parameters(), before), 0);
}

TEST(FlatOptimizer, TwoGroupsWithTheirOwnOptionsMatchTorch) {
  auto groups = [](const Params& params) {
    return std::vector<torch::optim::OptimizerParamGroup>{
        torch::optim::OptimizerParamGroup(Params(params.begin(), params.end() - 1)),
        torch::optim::OptimizerParamGroup({params.back()},
                                          std::make_unique<SGDOptions>(SGDOptions(0.1).weight_decay(0.2)))};
  };
  const SGDOptions defaults = SGDOptions(0.01).momentum(0.9);
  auto result = run_side_by_side(
      [&](const Params& params) { return std::make_unique<torch::optim::SGD>(groups(params), defaults); },
      [&](const Params& params) { return std::make_unique<FlatSGD>(groups(params), defaults); }, 50);
  EXPECT_LT(result.max_diff, 1e-6);
  EXPECT_GT(result.travelled, 0.1);
}

TEST(FlatOptimizer, GroupAddedLaterIsFlattenedAtTheNextStep) {
  auto first = torch::ones({4}).requires_grad_(), second = torch::ones({2, 3}).requires_grad_();
  FlatSGD optimizer({first}, SGDOptions(0.5));
  optimizer.add_param_group(torch::optim::OptimizerParamGroup({second}));
  first.mutable_grad() = torch::ones({4});
  second.mutable_grad() = torch::full({2, 3}, 2.0);
  optimizer.step();
  EXPECT_TRUE(torch::equal(first, torch::full({4}, 0.5)));
  EXPECT_TRUE(torch::equal(second, torch::zeros({2, 3})));
  EXPECT_EQ(second.data_ptr<float>(), optimizer.flat_params(1).data_ptr<float>());
}

TEST(FlatOptimizer, GradientOfAnotherLayoutIsCopiedIn) {
  auto weight = transposed_gradients_start();
  FlatSGD flat({weight}, SGDOptions(0.1).momentum(0.9));
  EXPECT_TRUE(torch::allclose(step_with_transposed_gradients(flat, weight), weight, 0, 1e-6));
  EXPECT_EQ(weight.grad().data_ptr<float>(), flat.flat_grads(0).data_ptr<float>());
}

// Runs `Saver` for 10 steps, hands its state through an archive to a `Loader` on a copy of
// the net, steps both 10 more times and returns the largest parameter difference.
template <typename Saver, typename Loader, typename Options>
double resumed_diff(const Options& options, bool load = true) {
  Net first = make_net();
  Saver saver(first.parameters(), options);
  for (int step = 0; step < 10; ++step) {
    feed(first.parameters(), gradients_for(first.parameters(), step), false);
    saver.step();
  }
  std::stringstream bytes;
  torch::serialize::OutputArchive out;
  saver.save(out);
  out.save_to(bytes);

  Net second = make_net();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < second.parameters().size(); ++i) second.parameters()[i].copy_(first.parameters()[i]);
  }
  Loader loader(second.parameters(), options);
  if (load) {
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    loader.load(in);
  }
  for (int step = 10; step < 20; ++step) {
    const Params grads = gradients_for(first.parameters(), step);
    feed(first.parameters(), grads, false);
    feed(second.parameters(), grads, step % 2 == 1);
    saver.step();
    loader.step();
  }
  return max_abs_diff(first.parameters(), second.parameters());
}

TEST(FlatOptimizer, SaveLoadIntoAFreshOptimizerContinuesBitExactly) {
  const SGDOptions sgd = SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(1e-3);
  EXPECT_EQ((resumed_diff<FlatSGD, FlatSGD>(sgd)), 0);
  EXPECT_GT((resumed_diff<FlatSGD, FlatSGD>(sgd, /*load=*/false)), 1e-3);  // the state matters
  const AdamWOptions adamw = AdamWOptions(1e-2);
  EXPECT_EQ((resumed_diff<FlatAdamW, FlatAdamW>(adamw)), 0);
  EXPECT_GT((resumed_diff<FlatAdamW, FlatAdamW>(adamw, /*load=*/false)), 1e-3);
}

TEST(FlatOptimizer, CheckpointsMoveBetweenTorchAndFlatOptimizers) {
  const SGDOptions sgd = SGDOptions(0.01).momentum(0.9);
  EXPECT_LT((resumed_diff<FlatSGD, torch::optim::SGD>(sgd)), 1e-6);
  EXPECT_LT((resumed_diff<torch::optim::SGD, FlatSGD>(sgd)), 1e-6);
  const AdamWOptions adamw = AdamWOptions(1e-2);
  EXPECT_LT((resumed_diff<FlatAdamW, torch::optim::AdamW>(adamw)), 1e-6);
  EXPECT_LT((resumed_diff<torch::optim::AdamW, FlatAdamW>(adamw)), 1e-6);
}

TEST(FlatOptimizer, LoadRefusesStateOfAnotherShape) {
  auto wide = torch::zeros({3, 4}).requires_grad_();
  FlatSGD saver({wide}, SGDOptions(0.1).momentum(0.9));
  wide.mutable_grad() = torch::ones({3, 4});
  saver.step();
  torch::serialize::OutputArchive out;
  saver.save(out);
  std::stringstream bytes;
  out.save_to(bytes);

  FlatSGD loader({torch::zeros({4, 3}).requires_grad_()}, SGDOptions(0.1).momentum(0.9));
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  const std::string message = testing::error_message<CheckpointError>([&] { loader.load(in); });
  EXPECT_TRUE(testing::Contains(message, "param_groups[0].params[0] momentum_buffer has shape [3, 4]"));
}

bool lies_in(const torch::Tensor& tensor, const torch::Tensor& flat) {
  const auto* begin = flat.data_ptr<float>();
  const auto* data = static_cast<const float*>(tensor.data_ptr());
  return data >= begin && data + tensor.numel() <= begin + flat.numel();
}

// The gradients a plain copy of `net` gets from `input`, as the independent reference.
Params reference_gradients(const Net& net, const torch::Tensor& input) {
  Net copy = make_net();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < copy.parameters().size(); ++i) copy.parameters()[i].copy_(net.parameters()[i]);
  }
  copy.loss(input).backward();
  Params grads;
  for (const auto& p : copy.parameters()) grads.push_back(p.grad());
  return grads;
}

void expect_grads_in_flat_buffer(const Net& net, const FlatOptimizer& optimizer, const Params& expected) {
  const Params params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(lies_in(params[i], optimizer.flat_params(0))) << "param " << i;
    EXPECT_TRUE(lies_in(params[i].grad(), optimizer.flat_grads(0))) << "grad " << i;
    // The same place in both buffers, so the fused loop pairs each weight with its gradient.
    EXPECT_EQ(static_cast<float*>(params[i].grad().data_ptr()) - optimizer.flat_grads(0).data_ptr<float>(),
              static_cast<float*>(params[i].data_ptr()) - optimizer.flat_params(0).data_ptr<float>());
    EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i], 1e-5, 1e-6)) << "grad " << i;
  }
}

TEST(FlatOptimizer, GradientsStayInTheFlatBufferAcrossBackward) {
  Net net = make_net();
  FlatSGD optimizer(net.parameters(), SGDOptions(0.01).momentum(0.9));
  torch::manual_seed(11);
  const torch::Tensor input = torch::randn({5, 6});
  net.loss(input).backward();  // new gradient tensors: the step moves them into the flat buffer
  optimizer.step();
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    EXPECT_EQ(optimizer.flat_grads(0).abs().sum().item<float>(), 0);
    const Params expected = reference_gradients(net, input);
    net.loss(input).backward();  // accumulates in place
    expect_grads_in_flat_buffer(net, optimizer, expected);
    optimizer.step();
  }
}

TEST(FlatOptimizer, TorchZeroGradKeepsGradientsInTheFlatBuffer) {
  Net net = make_net();
  FlatAdamW optimizer(net.parameters(), AdamWOptions(1e-3));
  torch::manual_seed(12);
  const torch::Tensor input = torch::randn({5, 6});
  net.loss(input).backward();
  optimizer.step();

  static_cast<torch::optim::Optimizer&>(optimizer).zero_grad();  // detach_() + zero_() per gradient
  net.loss(input).backward();
  expect_grads_in_flat_buffer(net, optimizer, reference_gradients(net, input));

  net.layers->zero_grad(/*set_to_none=*/false);
  net.extra.mutable_grad().zero_();
  net.loss(input).backward();
  expect_grads_in_flat_buffer(net, optimizer, reference_gradients(net, input));

  net.layers->zero_grad(/*set_to_none=*/true);  // what the Trainer does after each step
  net.extra.mutable_grad().reset();
  net.loss(input).backward();
  const Params expected = reference_gradients(net, input);
  optimizer.step();  // copies the new gradients in and points them at the flat buffer
  expect_grads_in_flat_buffer(net, optimizer, expected);
}

TEST(FlatOptimizer, ChannelsLastWeightKeepsItsLayoutAndStepsLikeTorch) {
  auto make_conv = [] {
    torch::manual_seed(3);
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3));
    torch::NoGradGuard no_grad;
    conv->weight.set_data(conv->weight.contiguous(torch::MemoryFormat::ChannelsLast));
    return conv;
  };
  auto reference_conv = make_conv(), flat_conv = make_conv();
  torch::optim::AdamW reference(reference_conv->parameters(), AdamWOptions(1e-2));
  FlatAdamW flat(flat_conv->parameters(), AdamWOptions(1e-2));
  ASSERT_TRUE(flat_conv->weight.is_contiguous(torch::MemoryFormat::ChannelsLast));
  // The flat buffer holds the weight in its memory order: output channel, row, column, input channel.
  EXPECT_TRUE(torch::equal(flat.flat_params(0).narrow(0, 0, 108), flat_conv->weight.permute({0, 2, 3, 1}).flatten()));

  torch::manual_seed(4);
  const torch::Tensor input = torch::randn({2, 3, 6, 6}).contiguous(torch::MemoryFormat::ChannelsLast);
  for (int step = 0; step < 20; ++step) {
    reference.zero_grad();
    flat.zero_grad();
    reference_conv->forward(input).pow(2).sum().backward();
    flat_conv->forward(input).pow(2).sum().backward();
    reference.step();
    flat.step();
  }
  EXPECT_TRUE(flat_conv->weight.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_EQ(flat_conv->weight.grad().strides(), flat_conv->weight.strides());
  EXPECT_TRUE(lies_in(flat_conv->weight.grad(), flat.flat_grads(0)));
  EXPECT_LT(max_abs_diff(reference_conv->parameters(), flat_conv->parameters()), 1e-6);
}

TEST(FlatOptimizer, ParametersReplacedByModuleLoadAreBroughtBack) {
  Net reference_net = make_net(), flat_net = make_net();
  torch::optim::SGD reference(reference_net.parameters(), SGDOptions(0.01).momentum(0.9));
  FlatSGD flat(flat_net.parameters(), SGDOptions(0.01).momentum(0.9));
  auto step_both = [&](int step) {
    const Params grads = gradients_for(reference_net.parameters(), step);
    feed(reference_net.parameters(), grads, false);
    feed(flat_net.parameters(), grads, false);
    reference.step();
    flat.step();
  };
  for (int step = 0; step < 5; ++step) step_both(step);

  torch::manual_seed(99);
  torch::nn::Sequential saved(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 3));
  std::stringstream bytes;
  torch::serialize::OutputArchive out;
  saved->save(out);
  out.save_to(bytes);
  for (auto* net : {&reference_net, &flat_net}) {
    torch::serialize::InputArchive in;
    bytes.seekg(0);
    in.load_from(bytes);
    net->layers->load(in);  // Tensor::set_ on each parameter: they leave the flat buffer
  }
  ASSERT_FALSE(lies_in(flat_net.parameters()[0], flat.flat_params(0)));

  for (int step = 5; step < 10; ++step) step_both(step);
  for (const auto& p : flat_net.parameters()) EXPECT_TRUE(lies_in(p, flat.flat_params(0)));
  EXPECT_LT(max_abs_diff(reference_net.parameters(), flat_net.parameters()), 1e-6);
  EXPECT_GT(max_abs_diff(flat_net.parameters(), make_net().parameters()), 0.1);  // the loaded values count
}

TEST(FlatOptimizer, RefusesWhatItCannotStep) {
  auto bf16 = torch::zeros({3}, torch::kBFloat16).requires_grad_();
  auto message = testing::error_message<UsageError>([&] { FlatSGD({bf16}, SGDOptions(0.1)); });
  EXPECT_TRUE(testing::Contains(message, "FlatSGD param_groups[0].params[0]: is BFloat16"));

  auto weight = torch::zeros({3}).requires_grad_();
  message = testing::error_message<UsageError>([&] { FlatSGD({weight, weight}, SGDOptions(0.1)); });
  EXPECT_TRUE(testing::Contains(message, "param_groups[0].params[1]: is listed twice"));

  message = testing::error_message<UsageError>([&] { FlatAdamW({weight}, AdamWOptions().amsgrad(true)); });
  EXPECT_TRUE(testing::Contains(message, "FlatAdamW param_groups[0].amsgrad: is not supported"));

  message = testing::error_message<UsageError>([&] { FlatSGD({weight}, SGDOptions(0.1).nesterov(true)); });
  EXPECT_TRUE(testing::Contains(message, "param_groups[0].nesterov: needs momentum > 0"));

  message = testing::error_message<UsageError>([&] { FlatAdamW({weight}, AdamWOptions().betas({0.9, 1.0})); });
  EXPECT_TRUE(testing::Contains(message, "param_groups[0].betas: must both be in [0, 1) (got 0.9, 1)"));

  FlatSGD optimizer({weight}, SGDOptions(0.1));
  optimizer.param_groups()[0].options().set_lr(-0.5);
  weight.mutable_grad() = torch::ones({3});
  message = testing::error_message<UsageError>([&] { optimizer.step(); });
  EXPECT_TRUE(testing::Contains(message, "FlatSGD param_groups[0].lr: must not be negative (got -0.5)"));
}

}  // namespace
}  // namespace afterburner::kernels
