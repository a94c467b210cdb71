// Helpers for the end-to-end tests of the `afterburner` executable: small IDX datasets written
// byte by byte, the stderr lines the CLI prints, and the flags that keep a run short.
#pragma once

#include <sys/types.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "testing.h"

namespace afterburner::testing {

// IDX file contents: magic 00 00 <type> <ndim>, big-endian uint32 dims, then `data` as is.
std::string idx_bytes(uint8_t type_code, const std::vector<uint32_t>& dims, const std::string& data);
constexpr uint8_t kIdxUint8 = 0x08;

void write_gzip_file(const std::filesystem::path& path, const std::string& bytes);

struct ImageSet {
  torch::Tensor images;  // uint8 [N, 28, 28]
  torch::Tensor labels;  // uint8 [N]
};

// A learnable set: class k is a bright block at its own place on a noisy background.
ImageSet synthetic_images(int64_t count, uint32_t seed);
std::string image_file_bytes(const ImageSet& set);
std::string label_file_bytes(const ImageSet& set);

// Writes the four MNIST-layout files into `dir`: the train split raw, the test split as .gz.
struct SyntheticMnist {
  ImageSet train, test;
};
SyntheticMnist write_synthetic_mnist(const std::filesystem::path& dir, int64_t train_count = 512,
                                     int64_t test_count = 256);

// The lines of the CLI's stderr, without the BLAS warning a machine with the reference BLAS adds.
std::vector<std::string> error_lines(const std::string& err);

// Success when the run exited with `exit_code` after printing exactly one error line
// "afterburner: ..." that contains each of `needles`.
::testing::AssertionResult fails_with(const CommandResult& result, int exit_code,
                                      const std::vector<std::string>& needles);

// Starts the CLI without waiting for it (its pid; waitpid it); its stderr and stdout go to the
// files given (truncated), or are discarded.
pid_t spawn_cli(const std::vector<std::string>& args, const std::filesystem::path& stderr_file = "/dev/null",
                const std::filesystem::path& stdout_file = "/dev/null");

// `train` on `data_dir` for a short, quiet, single-threaded fp32 run of one epoch; `flags` add
// to or replace those defaults (a flag mapped to "" is passed alone, like --resume).
std::vector<std::string> train_args(const std::filesystem::path& data_dir,
                                    const std::map<std::string, std::string>& flags = {});

// A GoogleTest parameter name from any text: "--batch-size abc" -> "batch_size_abc".
std::string test_name(const std::string& text);

nlohmann::json read_json(const std::filesystem::path& path);

// Writes the fixture bench/export_reference.py compares against: `input` and the C++ `output`.
void write_io_fixture(const std::filesystem::path& path, const torch::Tensor& input, const torch::Tensor& output);

// Python's torch.jit.load runs `model` on the fixture's input: exit 0 when it reproduces the output.
CommandResult python_check(const std::filesystem::path& model, const std::filesystem::path& io);

}  // namespace afterburner::testing
