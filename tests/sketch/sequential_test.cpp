// sketch_sequential: which layers of a C++ Sequential it replaces, that the replacements start
// from the dense weights, and that the result trains and round-trips through torch::save;
// fuse_epilogues: SKLinear + ReLU + Dropout as one layer over the same tensors, the same values.
#include "afterburner/sketch/sequential.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"
#include "testing.h"

namespace afterburner::sketch {
namespace {
namespace nn = torch::nn;
using afterburner::testing::Contains;

nn::Sequential small_cnn() {
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1)), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(16, 16, 3).groups(4)), nn::Flatten(), nn::Linear(16 * 6 * 6, 64),
                        nn::ReLU(), nn::Linear(64, 10));
}

TEST(SketchSequential, ReplacesLayersWhoseSketchCostsLessFromTheirWeights) {
  torch::manual_seed(1);
  nn::Sequential dense = small_cnn();
  auto sketched = sketch_sequential(dense, SketchConfig().terms(1).rank(5));
  const auto& layers = sketched.report.layers;
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_TRUE(layers[0].replaced());
  EXPECT_TRUE(Contains(layers[1].kept_because, "grouped convolutions are not sketched"));
  EXPECT_TRUE(layers[2].replaced());
  EXPECT_EQ(layers[3].kept_because, "rank 5 would not save: 2Lk(d_in + d_out) = 740 > d_in d_out = 640");

  auto conv = std::dynamic_pointer_cast<SKConv2dImpl>(sketched.model->ptr(0));
  auto linear = std::dynamic_pointer_cast<SKLinearImpl>(sketched.model->ptr(4));
  ASSERT_TRUE(conv && linear);
  EXPECT_EQ(sketched.model->ptr(2), dense->ptr(2));  // kept layers are shared
  // Initialised from the dense weights; the dense biases are kept.
  const torch::Tensor w = dense[4]->as<nn::Linear>()->weight.t();
  EXPECT_TRUE(torch::allclose(linear->S1s[0], w.mm(linear->U1s[0].t()), 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(linear->bias, dense[4]->as<nn::Linear>()->bias));
  EXPECT_TRUE(torch::equal(conv->bias, dense[0]->as<nn::Conv2d>()->bias));
  // Same output shapes as the dense model: padding and stride carried over.
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  EXPECT_EQ(sketched.model->forward(x).sizes(), dense->forward(x).sizes());

  const auto keys = sketched.model->named_parameters().keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "4.S1s"), keys.end());
  int64_t count = 0;
  for (const auto& p : sketched.model->parameters()) count += p.numel();
  EXPECT_EQ(sketched.report.params_after, count);
  EXPECT_EQ(sketched.report.params_before - sketched.report.params_after,
            (16 * 3 * 9 - 2 * 5 * 3 * 9) + (64 * 576 - 5 * (576 + 64)));
}

TEST(SketchSequential, TrainsAndRoundTripsThroughTorchSave) {
  torch::manual_seed(2);
  auto model = sketch_sequential(small_cnn(), SketchConfig().rank(2)).model;
  const torch::Tensor x = torch::randn({32, 3, 8, 8});
  const torch::Tensor y = torch::randint(0, 10, {32});
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto loss = [&] { return torch::cross_entropy_loss(model->forward(x), y); };
  const double first = loss().item<double>();
  for (int step = 0; step < 30; ++step) {
    sgd.zero_grad();
    loss().backward();
    sgd.step();
  }
  EXPECT_LT(loss().item<double>(), 0.5 * first);

  afterburner::testing::TempDir dir;
  torch::save(model, (dir / "model.pt").string());
  torch::manual_seed(3);  // other random buffers, overwritten by the load
  auto loaded = sketch_sequential(small_cnn(), SketchConfig().rank(2)).model;
  torch::load(loaded, (dir / "model.pt").string());
  EXPECT_TRUE(torch::equal(loaded->forward(x), model->forward(x)));
}

TEST(SketchSequential, ABadConfigNamesTheField) {
  EXPECT_TRUE(Contains(afterburner::testing::error_message<UsageError>(
                           [] { sketch_sequential(small_cnn(), SketchConfig().terms(0).rank(2)); }),
                       "sketch terms: must be at least 1, got 0"));
}

TEST(FuseEpilogues, SKLinearWithReluAndDropoutGivesTheSameValuesOverTheSameTensors) {
  torch::manual_seed(4);
  nn::Sequential model(nn::Flatten(), SKLinear(SKLinearOptions(48, 40).terms(2).rank(3)), nn::ReLU(),
                       nn::Dropout(0.25), SKLinear(SKLinearOptions(40, 30).rank(4)), nn::Dropout(0.5),
                       SKLinear(SKLinearOptions(30, 20).rank(2)), nn::ReLU(), nn::Linear(20, 10));
  FusedEpilogues fused = fuse_epilogues(model);
  ASSERT_EQ(fused.fused.size(), 3u);
  EXPECT_EQ(fused.fused[0], "layers 1-3: SKLinear + ReLU + Dropout");
  EXPECT_EQ(fused.fused[1], "layers 4-5: SKLinear + Dropout");
  EXPECT_EQ(fused.fused[2], "layers 6-7: SKLinear + ReLU");
  const auto first = std::dynamic_pointer_cast<SKLinearImpl>(fused.model->ptr(1));
  ASSERT_TRUE(first);
  EXPECT_TRUE(first->options.relu());
  EXPECT_EQ(first->options.dropout(), 0.25);
  EXPECT_TRUE(fused.model[2]->as<nn::Identity>() && fused.model[3]->as<nn::Identity>());
  // The same tensors under the same names: an optimizer of either trains both.
  const auto ours = fused.model->named_parameters(), theirs = model->named_parameters();
  ASSERT_EQ(ours.size(), theirs.size());
  for (const auto& item : theirs) EXPECT_TRUE(ours[item.key()].is_same(item.value())) << item.key();
  EXPECT_TRUE(fused.model->named_buffers()["1.U1s"].is_same(model->named_buffers()["1.U1s"]));

  const torch::Tensor x = torch::randn({9, 3, 4, 4});
  auto run = [&](nn::Sequential& m) {
    torch::manual_seed(5);
    const torch::Tensor y = m->forward(x);
    return std::make_pair(y, torch::autograd::grad({y.square().sum()}, m->parameters()));
  };
  const auto [y_fused, grads_fused] = run(fused.model);
  const auto [y_plain, grads_plain] = run(model);
  EXPECT_TRUE(torch::equal(y_fused, y_plain));
  for (size_t i = 0; i < grads_plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(grads_fused[i], grads_plain[i])) << "parameter " << i;
  }
  model->eval();
  fused.model->eval();
  EXPECT_TRUE(torch::equal(fused.model->forward(x), model->forward(x)));
}

TEST(FuseEpilogues, DrawsNothingAndLeavesOtherLayersShared) {
  torch::manual_seed(6);
  nn::Sequential model(SKLinear(SKLinearOptions(16, 12).rank(2)), nn::Tanh(), nn::Linear(12, 4), nn::ReLU());
  torch::manual_seed(7);
  const FusedEpilogues fused = fuse_epilogues(model);
  const torch::Tensor after = torch::rand({4});
  torch::manual_seed(7);
  EXPECT_TRUE(torch::equal(after, torch::rand({4})));
  EXPECT_TRUE(fused.fused.empty());
  for (size_t i = 0; i < model->size(); ++i) EXPECT_EQ(fused.model->ptr(i), model->ptr(i)) << i;
}

}  // namespace
}  // namespace afterburner::sketch
