// train::Bf16Weights on a model written in Python, scripted and traced: the weights it reads from
// bf16 copies are exactly those its forward reads once, outside loops, as a convolution's or
// linear layer's argument; training with them gives the bits training without them gives, and the
// Trainer leaves them off where gradients are summed or read before the step.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "afterburner/data/loader.h"
#include "afterburner/kernels/flat_optim.h"
#include "afterburner/kernels/fuse.h"
#include "afterburner/train/bf16_weights.h"
#include "afterburner/train/trainer.h"
#include "quadrants.h"
#include "testing.h"

namespace afterburner::train {
namespace {

// 8x8 one-channel images in, 4 classes out. Weights read once by a convolution or a linear layer
// (stem, block.conv, penalised.weight, head), and weights that are not: BatchNorm's and
// LayerNorm's, one read in a loop (repeated), one tied between two layers (tied), a bias read
// twice (penalised.bias), a parameter multiplied (scale).
const char* const kModelSource = R"(
import sys
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.block = Block()
        self.repeated = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.tied = nn.Linear(16, 16, bias=False)
        self.tied_again = nn.Linear(16, 16, bias=False)
        self.tied_again.weight = self.tied.weight
        self.penalised = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        x = self.block(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 2).flatten(1)
        for _ in range(2):
            x = torch.relu(self.repeated(x))
        x = self.norm(x)
        x = self.tied_again(self.tied(x))
        x = self.penalised(x) + self.penalised.bias.sum()
        return self.head(x) * self.scale


torch.manual_seed(0)
net = Net()
if sys.argv[2] == "trace":
    torch.jit.trace(net.eval(), torch.randn(2, 1, 8, 8)).save(sys.argv[1])
else:
    torch.jit.script(net).save(sys.argv[1])
)";

const std::vector<std::string> kCopied{"block.conv.weight", "head.bias", "head.weight",
                                       "penalised.weight",  "stem.bias", "stem.weight"};
// A trace loaded from its file records aten::_convolution on inputs of unknown rank, which the fuse
// rewrite leaves as it is and which is not on autocast's CPU list: its convolutions keep float32
// weights.
const std::vector<std::string> kCopiedOfTrace{"head.bias", "head.weight", "penalised.weight"};

Model python_model(const std::string& compile) {
  testing::TempDir dir;
  const std::string path = (dir / "net.pt").string();
  testing::write_file(dir / "net.py", kModelSource);  // torch.jit.script reads the source of the file
  const auto saved = testing::run({"/usr/bin/python3", (dir / "net.py").string(), path, compile});
  EXPECT_EQ(saved.exit_code, 0) << saved.err;
  torch::jit::Module script = torch::jit::load(path);
  for (auto parameter : script.parameters()) parameter.requires_grad_(true);
  return Model(script, kernels::fuse_forward(script).forward);
}

struct TrainedRun {
  std::vector<torch::Tensor> initial, parameters;
  std::vector<double> losses;
  std::vector<std::string> copied;  // Bf16Weights::names(), empty without
};

// Records each step's loss.
class Losses : public Callback {
 public:
  explicit Losses(std::vector<double>& losses) : losses_(losses) {}
  void on_step_end(const StepInfo& info) override { losses_.push_back(info.loss); }

 private:
  std::vector<double>& losses_;
};

TrainedRun train(const std::string& compile, TrainerOptions options) {
  Model model = python_model(compile);
  data::Loader train(quadrant_dataset(512, 1), data::LoaderOptions().batch_size(32).workers(0).seed(5));
  data::Loader test(quadrant_dataset(64, 2), data::LoaderOptions().batch_size(64).workers(0).shuffle(false));
  auto optimizer = make_optimizer(
      OptimizerOptions().lr(0.05).momentum(0.9).nesterov(true).weight_decay(5e-4).fused(true), model.parameters());
  Trainer trainer(model, std::move(optimizer), LrSchedule(ScheduleOptions().kind("constant"), 0.05, 1), train, test,
                  options.epochs(2).precision(Precision::bf16).model_name("net"));
  TrainedRun run;
  for (const auto& p : model.parameters()) run.initial.push_back(p.detach().clone());
  trainer.add_callback(std::make_shared<Losses>(run.losses));
  trainer.fit();
  if (trainer.bf16_weights() != nullptr) run.copied = trainer.bf16_weights()->names();
  for (const auto& p : model.parameters()) run.parameters.push_back(p.detach().clone());
  return run;
}

bool same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i].view(torch::kInt32), b[i].view(torch::kInt32))) return false;
  }
  return true;
}

class Bf16WeightsOf : public ::testing::TestWithParam<const char*> {};

TEST_P(Bf16WeightsOf, APythonModelTrainsToTheBitsOfAutocastsCasts) {
  const TrainedRun with = train(GetParam(), TrainerOptions());
  const TrainedRun without = train(GetParam(), TrainerOptions().bf16_weights(false));
  std::vector<std::string> copied = with.copied;
  std::sort(copied.begin(), copied.end());
  EXPECT_EQ(copied, std::string(GetParam()) == "trace" ? kCopiedOfTrace : kCopied);
  EXPECT_TRUE(without.copied.empty());
  ASSERT_EQ(with.losses.size(), 32u);
  EXPECT_EQ(with.losses, without.losses);
  EXPECT_TRUE(same_bits(with.parameters, without.parameters));
  EXPECT_FALSE(same_bits(with.parameters, with.initial)) << "it trains";
}

INSTANTIATE_TEST_SUITE_P(ScriptedAndTraced, Bf16WeightsOf, ::testing::Values("script", "trace"));

// Where gradients are summed over micro-batches, or read before the step, the copies stay off.
TEST(Bf16Weights, OffWhereGradientsAreSummedOrReadBeforeTheStep) {
  for (const auto& options : {TrainerOptions().accumulate(2), TrainerOptions().clip_grad_norm(1.0),
                              TrainerOptions().clip_grad_value(0.5)}) {
    EXPECT_TRUE(train("script", options).copied.empty());
  }
}

// The copies are read in the training forward only: the module's slots hold the float32
// parameters outside it (evaluation, export), and again after a forward that threw.
TEST(Bf16Weights, TheModuleHoldsItsParametersOutsideTheForward) {
  Model model = python_model("script");
  kernels::FlatSGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
  Bf16Weights weights(model, optimizer);
  ASSERT_EQ(weights.size(), kCopied.size());
  ASSERT_EQ(weights.copies().size(), kCopied.size());
  const auto head = std::find(weights.names().begin(), weights.names().end(), "head.weight");
  ASSERT_NE(head, weights.names().end());
  const torch::Tensor& head_copy = weights.copies()[size_t(head - weights.names().begin())];
  const torch::Tensor before = model.script()->attr("head").toModule().attr("weight").toTensor();
  {
    auto reading = weights.in_forward();
    const torch::Tensor inside = model.script()->attr("head").toModule().attr("weight").toTensor();
    EXPECT_TRUE(inside.is_same(head_copy));
    EXPECT_EQ(inside.scalar_type(), torch::kBFloat16);
    EXPECT_THROW(model.forward(torch::randn({2, 3, 8, 8})), std::exception);  // 3 channels: refused
  }
  const torch::Tensor after = model.script()->attr("head").toModule().attr("weight").toTensor();
  EXPECT_TRUE(after.is_same(before));
}

}  // namespace
}  // namespace afterburner::train
