// A model repository holding the zoo's cnn, shared by the serve tests.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace afterburner::serve::testing {

// The config.toml as written there (max_batch_size 64, max_queue_delay_us 2000,
// preferred sizes [16, 32, 64], 1 instance, input "input" FP32 [1, 28, 28], output "output"
// FP32 [10]), with its batching keys and the output size replaceable.
std::string cnn_config(int64_t max_batch_size = 64, const std::string& preferred_batch_sizes = "[16, 32, 64]",
                       int64_t max_queue_delay_us = 2000, int64_t output_dims = 10);

// Exports `model` (in eval mode) as REPOSITORY/cnn/model.pt, with `config` as its config.toml.
void write_cnn_model(const std::filesystem::path& repository, torch::nn::Sequential model, const std::string& config);

}  // namespace afterburner::serve::testing
