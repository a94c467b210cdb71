#include "test_models.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <zlib.h>

#include <map>

#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "testing.h"

namespace afterburner::testing {

torch::jit::Module conv_bn_dropout_model() {
  torch::manual_seed(3);
  torch::jit::Module model("__torch__.ConvBnDropout");
  model.register_attribute("training", c10::BoolType::get(), true);
  model.register_parameter("conv_weight", torch::randn({4, 1, 3, 3}), false);
  model.register_parameter("conv_bias", torch::randn({4}), false);
  model.register_parameter("bn_weight", torch::rand({4}) + 0.5, false);
  model.register_parameter("bn_bias", torch::randn({4}), false);
  model.register_buffer("bn_mean", torch::randn({4}));
  model.register_buffer("bn_var", torch::rand({4}) + 0.5);
  model.register_parameter("fc_weight", torch::randn({10, 4 * 8 * 8}) * 0.05, false);
  model.register_parameter("fc_bias", torch::randn({10}), false);
  model.define(R"(
def forward(self, x):
    y = torch.conv2d(x, self.conv_weight, self.conv_bias, [1, 1], [1, 1])
    y = torch.batch_norm(y, self.bn_weight, self.bn_bias, self.bn_mean, self.bn_var, self.training, 0.1, 1e-5, False)
    y = torch.dropout(torch.relu(y), 0.5, self.training)
    return torch.linear(y.flatten(1), self.fc_weight, self.fc_bias)
)");
  return model;
}

namespace {

// IDX payload after its header; the tests read the gzip files Debian installs.
std::string read_idx_payload(const std::string& name, int64_t header_bytes, int64_t bytes) {
  const auto path = (fashion_mnist_dir() / name).string();
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error(path + ": cannot open");
  std::string data(static_cast<size_t>(header_bytes + bytes), '\0');
  const int read = gzread(file, data.data(), static_cast<unsigned>(data.size()));
  gzclose(file);
  if (read != static_cast<int>(data.size())) throw std::runtime_error(path + ": too short");
  return data.substr(static_cast<size_t>(header_bytes));
}

torch::Tensor bytes_to_tensor(const std::string& bytes) {
  return torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, torch::kUInt8)
      .clone();
}

torch::jit::Module train_and_export(const std::string& name) {
  torch::manual_seed(0);
  auto model = models::make_model(name);
  const int64_t batch = 64, steps = 300;
  auto images = fashion_mnist_images("train", batch * steps);
  auto labels = fashion_mnist_labels("train", batch * steps);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  model->train();
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto loss = torch::cross_entropy_loss(model->forward(images.slice(0, step * batch, (step + 1) * batch)),
                                          labels.slice(0, step * batch, (step + 1) * batch));
    loss.backward();
    optimizer.step();
  }
  TempDir dir;
  const auto path = (dir / (name + ".pt")).string();
  models::export_torchscript(model, path);
  return torch::jit::load(path);
}

}  // namespace

torch::jit::Module trained_zoo_model(const std::string& name) {
  static std::map<std::string, torch::jit::Module> trained;
  auto found = trained.find(name);
  if (found == trained.end()) found = trained.emplace(name, train_and_export(name)).first;
  return found->second.clone();
}

torch::Tensor fashion_mnist_images(const std::string& split, int64_t count) {
  auto pixels = bytes_to_tensor(read_idx_payload(split + "-images-idx3-ubyte.gz", 16, count * 28 * 28));
  return (pixels.to(torch::kFloat).reshape({count, 1, 28, 28}) / 255.0 - 0.2860) / 0.3530;
}

torch::Tensor fashion_mnist_labels(const std::string& split, int64_t count) {
  return bytes_to_tensor(read_idx_payload(split + "-labels-idx1-ubyte.gz", 8, count)).to(torch::kLong);
}

namespace {

bool block_has(const torch::jit::Block* block, const std::string& kind) {
  for (const auto* node : block->nodes()) {
    if (node->kind().toQualString() == kind) return true;
    for (const auto* inner : node->blocks()) {
      if (block_has(inner, kind)) return true;
    }
  }
  return false;
}

}  // namespace

torch::Tensor answer(torch::jit::Module& model, const torch::Tensor& x) {
  c10::InferenceMode inference;
  return model.forward({x}).toTensor();
}

torch::Tensor exact_answer(const torch::jit::Module& model, const torch::Tensor& x) {
  torch::jit::Module wide = model.clone();
  wide.to(torch::kDouble);
  return answer(wide, x.to(torch::kDouble));
}

int nodes_of_kind(const torch::jit::Module& model, const std::string& kind) {
  int found = 0;
  for (const torch::jit::Node* node : model.get_method("forward").graph()->nodes()) {
    found += node->kind().toQualString() == kind;
  }
  return found;
}

bool graph_has(const torch::jit::Module& model, const std::string& kind) {
  auto graph = model.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  return block_has(graph->block(), kind);
}

}  // namespace afterburner::testing
