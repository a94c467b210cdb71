#include "cnn_repository.h"

#include <fmt/format.h>

#include "afterburner/models/export.h"
#include "testing.h"

namespace afterburner::serve::testing {

std::string cnn_config(int64_t max_batch_size, const std::string& preferred_batch_sizes, int64_t max_queue_delay_us,
                       int64_t output_dims) {
  return fmt::format(R"(max_batch_size = {}
max_queue_delay_us = {}
preferred_batch_sizes = {}
instances = 1
[[input]]
name = "input"
datatype = "FP32"
dims = [1, 28, 28]
[[output]]
name = "output"
datatype = "FP32"
dims = [{}]
)",
                     max_batch_size, max_queue_delay_us, preferred_batch_sizes, output_dims);
}

void write_cnn_model(const std::filesystem::path& repository, torch::nn::Sequential model, const std::string& config) {
  std::filesystem::create_directories(repository / "cnn");
  model->eval();
  models::export_torchscript(model, (repository / "cnn" / "model.pt").string());
  afterburner::testing::write_file(repository / "cnn" / "config.toml", config);
}

}  // namespace afterburner::serve::testing
