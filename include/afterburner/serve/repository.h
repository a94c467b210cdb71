// A model repository: one directory per model, each with a TOML config and a TorchScript file,
// beside it (version 1) or in numbered version directories, of which the highest is served.
//
//   models/cnn/config.toml     max_batch_size = 64, max_queue_delay_us = 2000, [[input]] ...
//   models/cnn/model.pt        torch.jit.save / models::export_torchscript
//   models/resnet/config.toml
//   models/resnet/1/model.pt   (Triton's layout: resnet serves version 2)
//   models/resnet/2/model.pt
//
// An [[input]] with format = "image" takes JPEG or PNG bytes instead of a tensor (ImageInput).
//
//   auto repository = afterburner::serve::load_repository("models");
//   for (const auto& model : repository.models) std::cout << model.name << "\n";
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace afterburner::serve {

// The Open Inference Protocol tensor datatypes afterburner serves (BYTES is not one of them).
enum class DataType { BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, FP32, FP64 };

std::string_view datatype_name(DataType type);
std::optional<DataType> parse_datatype(std::string_view name);
std::size_t datatype_size(DataType type);  // bytes per element

struct TensorSpec {
  std::string name;
  DataType datatype = DataType::FP32;
  std::vector<int64_t> dims;  // per sample, without the batch dimension; -1 = any size
  // Inputs only: false refuses requests holding NaN or infinities in this input with a 400
  // (true, the default, passes them to the model, which answers as Python's would).
  bool allow_non_finite = true;
};

// The position of the spec named `name`, specs.size() if none is.
std::size_t spec_index(const std::vector<TensorSpec>& specs, std::string_view name);

// An input that takes encoded images (format = "image" on the model's one [[input]], FP32 of
// dims [C, S, S], C 1 or 3): each JPEG or PNG decoded, resized and centre-cropped to S as
// `transforms` says (data/image_transforms.h; a training list stands for its evaluation
// counterpart), colour made gray for C = 1 (PIL's convert("L")), scaled to [0, 1] and normalised
// per channel, as the model's evaluation inputs were; the answer names the top classes of the
// first output. Keys the config leaves out come from the model file's afterburner.json (`train
// --export`), else: Resize(S * 256 / 224) + CenterCrop(S), no normalisation, classes numbered.
struct ImageInput {
  std::string transforms;
  std::vector<double> mean, std;     // of pixels in [0, 1], per channel (or one for all)
  std::vector<std::string> classes;  // output index i names classes[i]; config: classes_file
};

// Where a model's files are: DIR/<name>/config.toml, and DIR/<name>/model.pt (version "1") or
// DIR/<name>/<highest version>/model.pt.
struct ModelFiles {
  std::string name;  // the model's directory name
  std::string version;
  std::filesystem::path config_file;
  std::filesystem::path model_file;

  // The files' paths, sizes and modification times: a model changed on disk stamps otherwise.
  std::string stamp() const;
};

// Throws DataError naming the directory when it holds both model.pt and version directories.
ModelFiles locate_model_files(const std::filesystem::path& model_dir);

struct ModelConfig {
  std::string name;                    // the model's directory name
  std::string version = "1";           // the version directory's name, "1" for model.pt beside the config
  std::filesystem::path config_file;   // DIR/<name>/config.toml
  std::filesystem::path model_file;    // DIR/<name>/model.pt or DIR/<name>/<version>/model.pt
  int64_t max_batch_size = 1;          // samples per forward
  int64_t max_queue_delay_us = 0;      // longest wait for a fuller batch, from the oldest arrival
  std::vector<int64_t> preferred_batch_sizes;  // ascending; a queue prefix of one runs at once
  bool dynamic_batching = true;        // false: one request per forward
  int64_t instances = 1;               // model copies, one worker thread each
  // Queued requests before 503. 0 = 2 x max_batch_size x instances: about two batches of
  // waiting per instance, so that accepted requests keep their latency under overload.
  int64_t max_queue_size = 0;
  int64_t timeout_us = 10'000'000;     // a request still queued after this fails without running
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::optional<ImageInput> image;  // the input takes images

  int64_t queue_capacity() const;
};

// Reads DIR/<name>/config.toml and checks that the model file locate_model_files finds exists.
// Throws UsageError naming the file and key for a bad or unknown key, DataError naming the file
// for a syntax error or a missing model file.
ModelConfig load_model_config(const std::filesystem::path& model_dir);
ModelConfig load_model_config(const ModelFiles& files);

// The names of the model directories in `dir`, sorted. Throws DataError if `dir` is no directory.
std::vector<std::string> list_models(const std::filesystem::path& dir);

struct Repository {
  std::filesystem::path dir;
  std::vector<ModelConfig> models;  // by name
};

// Every subdirectory of `dir` is a model. Throws DataError for a missing or empty repository.
Repository load_repository(const std::filesystem::path& dir);

}  // namespace afterburner::serve
