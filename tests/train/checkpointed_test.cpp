#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/models/zoo.h"
#include "afterburner/profile/memory.h"
#include "afterburner/train/checkpointed.h"

namespace afterburner::train {
namespace {

std::vector<torch::Tensor> gradients_of(torch::nn::Sequential& model, const torch::Tensor& x) {
  model->zero_grad();
  model->forward(x).pow(2).sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

// Linear - Dropout - ReLU as one module (AnyModule cannot hold a Sequential directly).
struct NoisyBlockImpl : torch::nn::Module {
  torch::nn::Sequential layers{torch::nn::Linear(16, 32), torch::nn::Dropout(0.5), torch::nn::ReLU()};
  NoisyBlockImpl() { register_module("layers", layers); }
  torch::Tensor forward(const torch::Tensor& x) { return layers->forward(x); }
};
TORCH_MODULE(NoisyBlock);

// Two wide layers: several activations inside, one tensor in and out.
struct WideBlockImpl : torch::nn::Module {
  torch::nn::Linear up{256, 1024}, down{1024, 256};
  WideBlockImpl() {
    register_module("up", up);
    register_module("down", down);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(down(torch::relu(up(x)))); }
};
TORCH_MODULE(WideBlock);

}  // namespace

TEST(Checkpointed, GradientsMatchThePlainModel) {
  torch::manual_seed(0);
  auto plain = models::make_model("resnet");
  auto x = torch::randn({4, 1, 28, 28});
  auto expected = gradients_of(plain, x);
  auto wrapped = plain;  // same parameters, wrapped in place below
  checkpoint_layers(wrapped, {3, 4, 5});
  auto actual = gradients_of(wrapped, x);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-5, 1e-5)) << "parameter " << i;
  }
}

TEST(Checkpointed, InputGradientMatchesAndDropoutIsReplayed) {
  torch::manual_seed(0);
  NoisyBlock inner;
  Checkpointed wrapped{torch::nn::AnyModule(inner)};
  auto x = torch::randn({8, 16}, torch::requires_grad());

  torch::manual_seed(7);
  inner->forward(x).sum().backward();
  auto expected = x.grad().clone();
  x.grad().zero_();
  torch::manual_seed(7);
  wrapped->forward(x).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), expected, 1e-6, 1e-6));
}

TEST(Checkpointed, KeepsFewerActivations) {
  profile::TensorMemory::install();
  torch::manual_seed(0);
  auto x = torch::randn({1024, 256});
  auto peak_of_backward = [&](torch::nn::Sequential model) {
    model->zero_grad();
    profile::TensorMemory::reset_peak();
    int64_t before = profile::TensorMemory::current_bytes();
    model->forward(x).sum().backward();
    return profile::TensorMemory::peak_bytes() - before;
  };
  torch::nn::Sequential plain;
  for (int i = 0; i < 6; ++i) plain->push_back(WideBlock());
  peak_of_backward(plain);  // allocate the gradients once, so both runs start alike
  int64_t plain_peak = peak_of_backward(plain);
  checkpoint_layers(plain, {0, 1, 2, 3, 4, 5});
  int64_t checkpointed_peak = peak_of_backward(plain);
  // Plain keeps 6 blocks' activations (5 MiB each); checkpointed keeps 6 block inputs (1 MiB
  // each) and recomputes one block at a time during backward.
  EXPECT_LT(checkpointed_peak, plain_peak * 0.6)
      << "plain " << plain_peak << " bytes, checkpointed " << checkpointed_peak;
}

TEST(Checkpointed, IndexOutOfRangeIsAUsageError) {
  auto model = models::make_model("cnn");
  EXPECT_THROW(checkpoint_layers(model, {42}), UsageError);
}

}  // namespace afterburner::train
