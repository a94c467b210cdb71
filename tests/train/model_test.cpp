// train::Model: a module holder and a TorchScript module behave alike in the Trainer. A
// TorchScript file of a zoo model trains to the same weights as the zoo model itself, and its
// checkpoints save and restore it in place.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "afterburner/data/dataset.h"
#include "afterburner/data/loader.h"
#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "afterburner/train/checkpoint.h"
#include "afterburner/train/model.h"
#include "afterburner/train/trainer.h"
#include "quadrants.h"
#include "testing.h"

namespace afterburner::train {
namespace {

torch::nn::Sequential small_cnn() {
  torch::manual_seed(3);
  return models::make_model("cnn", models::ModelOptions().image_size(8).num_classes(4));
}

// `sequential` (without BatchNorm or Dropout, which the inference export fixes in evaluation
// mode) exported as TorchScript and loaded back, its parameters requiring grad as those of a
// module Python saves do.
torch::jit::Module as_script(const torch::nn::Sequential& sequential) {
  testing::TempDir dir;
  const std::string path = (dir / "model.pt").string();
  models::export_torchscript(sequential, path);
  torch::jit::Module script = torch::jit::load(path);
  for (auto parameter : script.parameters()) parameter.requires_grad_(true);
  return script;
}

std::vector<torch::Tensor> trained_parameters(Model model, int epochs) {
  data::Loader train(quadrant_dataset(2048, 1), data::LoaderOptions().batch_size(32).workers(0).seed(5));
  data::Loader test(quadrant_dataset(128, 2), data::LoaderOptions().batch_size(64).workers(0).shuffle(false));
  Trainer trainer(model, make_optimizer(OptimizerOptions().lr(0.02).momentum(0.9), model.parameters()),
                  LrSchedule(ScheduleOptions().kind("constant"), 0.02, 1), train, test,
                  TrainerOptions().epochs(epochs).model_name("cnn"));
  const TrainReport report = trainer.fit();
  EXPECT_GT(report.test_accuracy, 0.5);  // chance is 0.25
  std::vector<torch::Tensor> parameters;
  for (const auto& p : model.parameters()) parameters.push_back(p.detach().clone());
  return parameters;
}

TEST(Model, ATorchScriptFileTrainsToTheWeightsOfTheModuleItWasExportedFrom) {
  const auto from_module = trained_parameters(small_cnn(), 3);
  const auto from_script = trained_parameters(as_script(small_cnn()), 3);
  ASSERT_EQ(from_module.size(), from_script.size());
  for (size_t i = 0; i < from_module.size(); ++i) {
    EXPECT_TRUE(torch::allclose(from_module[i], from_script[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(Model, BothKindsNameTheirStateAsModuleSaveDoes) {
  auto sequential = small_cnn();
  const Model module(sequential), script(as_script(sequential));
  const auto expected = sequential->named_parameters();
  for (const Model* model : {&module, &script}) {
    const auto named = model->named_parameters();
    ASSERT_EQ(named.size(), expected.size());
    for (size_t i = 0; i < named.size(); ++i) {
      // The export names its layers layer0, layer1, ... where Sequential says 0, 1, ...
      EXPECT_EQ(named[i].first, (model == &script ? "layer" : "") + expected[i].key());
      EXPECT_TRUE(torch::equal(named[i].second, expected[i].value()));
    }
    const StateTree tree = model->state();
    EXPECT_TRUE(tree.parameters.empty());
    ASSERT_EQ(tree.children.front().first, model == &script ? "layer0" : "0");
    EXPECT_EQ(tree.children.front().second.parameters.front().first, "weight");
  }
  auto x = torch::randn({3, 1, 8, 8});
  EXPECT_TRUE(torch::allclose(module.forward(x), script.forward(x), 1e-6, 1e-6));
}

TEST(Model, ACheckpointRestoresATorchScriptModelInPlace) {
  testing::TempDir dir;
  const std::string path = (dir / "ckpt.pt").string();
  Model script(as_script(small_cnn()));
  auto optimizer = make_optimizer(OptimizerOptions(), script.parameters());
  GradScaler scaler;
  std::vector<torch::Tensor> saved;
  for (const auto& p : script.parameters()) saved.push_back(p.detach().clone());
  const torch::Tensor storage = script.parameters().front();
  save_checkpoint(path, {"cnn", script, *optimizer, scaler, {}});
  {
    torch::NoGradGuard no_grad;
    for (auto& p : script.parameters()) p.add_(1);
  }
  load_checkpoint(path, {"cnn", script, *optimizer, scaler, {}});
  const auto restored = script.parameters();
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_TRUE(torch::equal(restored[i], saved[i])) << "parameter " << i;
  EXPECT_EQ(restored.front().data_ptr(), storage.data_ptr()) << "restored in place";
}

TEST(Model, TrainModeZeroGradAndAForwardThatIsNotATensor) {
  torch::jit::Module scaled("Scaled");  // as Python scripts a module: with a training flag
  scaled.register_attribute("training", c10::BoolType::get(), true);
  scaled.register_parameter("weight", torch::ones({3}).requires_grad_(), /*is_buffer=*/false);
  scaled.define("def forward(self, x):\n  return x * self.weight\n");
  Model script(scaled);
  script.train(false);
  EXPECT_FALSE(script.is_training());
  script.train();
  EXPECT_TRUE(script.is_training());
  script.forward(torch::randn({2, 3})).sum().backward();
  EXPECT_TRUE(script.parameters().front().grad().defined());
  script.zero_grad();
  EXPECT_FALSE(script.parameters().front().grad().defined());

  torch::jit::Module pair("Pair");
  pair.define("def forward(self, x):\n  return (x, x)\n");
  auto message = testing::error_message<UsageError>([&] { Model(pair).forward(torch::zeros({1})); });
  EXPECT_EQ(message, "model: its forward returns Tuple, expected one Tensor of logits");
}

}  // namespace
}  // namespace afterburner::train
