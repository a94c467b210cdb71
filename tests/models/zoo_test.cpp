#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "testing.h"

namespace afterburner::models {

TEST(Zoo, EveryModelMapsImagesToClassLogits) {
  for (const auto& name : model_names()) {
    auto model = make_model(name);
    auto out = model->forward(torch::randn({3, 1, 28, 28}));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 10})) << name;
  }
}

TEST(Zoo, CnnHasTheDocumentedLayers) {
  auto model = make_model("cnn");
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  // conv 1->32 (3x3) + conv 32->64 (3x3) + fc 3136->128 + fc 128->10, with biases.
  int64_t expected = (9 * 32 + 32) + (9 * 32 * 64 + 64) + (3136 * 128 + 128) + (128 * 10 + 10);
  EXPECT_EQ(params, expected);
}

TEST(Zoo, UnknownModelIsAUsageErrorListingTheKnownOnes) {
  try {
    make_model("transformer");
    FAIL() << "expected an error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("cnn"), std::string::npos);
    EXPECT_EQ(e.exit_code(), 2);
  }
}

// The exported TorchScript must compute what the C++ module computes in eval mode.
TEST(Export, TorchScriptMatchesTheModuleForEveryModel) {
  testing::TempDir dir;
  torch::manual_seed(3);
  auto input = torch::randn({4, 1, 28, 28});
  for (const auto& name : model_names()) {
    auto model = make_model(name);
    model->train();
    model->forward(input);  // moves BatchNorm running statistics away from their defaults
    model->eval();
    auto expected = model->forward(input);
    auto path = (dir / (name + ".pt")).string();
    export_torchscript(model, path);
    auto loaded = torch::jit::load(path);
    auto actual = loaded.forward({input}).toTensor();
    EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-5)) << name;
  }
}

TEST(Export, ParametersKeepTheirNames) {
  testing::TempDir dir;
  auto path = (dir / "cnn.pt").string();
  export_torchscript(make_model("cnn"), path);
  auto loaded = torch::jit::load(path);
  std::set<std::string> names;
  for (const auto& p : loaded.named_parameters()) names.insert(p.name);
  EXPECT_TRUE(names.count("layer0.weight"));
  EXPECT_TRUE(names.count("layer9.bias"));
}

TEST(Export, UnsupportedLayerNamesItsType) {
  testing::TempDir dir;
  torch::nn::Sequential model{torch::nn::Tanh()};
  try {
    export_torchscript(model, (dir / "m.pt").string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Tanh"), std::string::npos) << e.what();
  }
}

TEST(Export, UnwritablePathIsAnErrorNamingIt) {
  EXPECT_THROW(export_torchscript(make_model("mlp"), "/nonexistent-dir/m.pt"), Error);
}

}  // namespace afterburner::models
