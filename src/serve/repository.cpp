#include "afterburner/serve/repository.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <utility>

#include "afterburner/core/error.h"
#include "afterburner/data/image_transforms.h"
#include "afterburner/infer/model_file.h"

namespace afterburner::serve {
namespace fs = std::filesystem;

namespace {

constexpr std::array<std::pair<DataType, std::string_view>, 9> kDatatypeNames{{
    {DataType::BOOL, "BOOL"},
    {DataType::UINT8, "UINT8"},
    {DataType::INT8, "INT8"},
    {DataType::INT16, "INT16"},
    {DataType::INT32, "INT32"},
    {DataType::INT64, "INT64"},
    {DataType::FP16, "FP16"},
    {DataType::FP32, "FP32"},
    {DataType::FP64, "FP64"},
}};

// Reads the keys of one TOML table, each error naming the file and the key's path.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string file, std::string prefix)
      : table_(table), file_(std::move(file)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(std::string_view key, const std::string& problem) const {
    throw UsageError(key_name(key), problem);
  }

  // "DIR/config.toml: input[0].mean"
  std::string key_name(std::string_view key) const { return fmt::format("{}: {}{}", file_, prefix_, key); }

  void reject_unknown_keys(std::initializer_list<std::string_view> known) const {
    for (const auto& [key, node] : table_) {
      if (std::find(known.begin(), known.end(), key.str()) == known.end()) fail(key.str(), "unknown key");
    }
  }

  std::optional<int64_t> integer(std::string_view key, int64_t min) const {
    const toml::node* node = table_.get(key);
    if (!node) return std::nullopt;
    auto value = node->value_exact<int64_t>();
    if (!value) fail(key, "must be an integer");
    if (*value < min) fail(key, fmt::format("must be at least {}, got {}", min, *value));
    return value;
  }

  std::optional<bool> boolean(std::string_view key) const {
    const toml::node* node = table_.get(key);
    if (!node) return std::nullopt;
    auto value = node->value_exact<bool>();
    if (!value) fail(key, "must be true or false");
    return value;
  }

  std::string string(std::string_view key) const {
    if (!table_.get(key)) fail(key, "missing");
    return *optional_string(key);
  }

  std::optional<std::string> optional_string(std::string_view key) const {
    const toml::node* node = table_.get(key);
    if (!node) return std::nullopt;
    auto value = node->value_exact<std::string>();
    if (!value || value->empty()) fail(key, "must be a non-empty string");
    return value;
  }

  // An array of numbers (integers or floats).
  std::optional<std::vector<double>> numbers(std::string_view key) const {
    const toml::node* node = table_.get(key);
    if (!node) return std::nullopt;
    const toml::array* array = node->as_array();
    if (!array || array->empty()) fail(key, "must be an array of numbers");
    std::vector<double> values;
    for (const auto& item : *array) {
      auto value = item.value<double>();
      if (!value || !(item.is_floating_point() || item.is_integer())) fail(key, "must be an array of numbers");
      values.push_back(*value);
    }
    return values;
  }

  bool has(std::string_view key) const { return table_.get(key) != nullptr; }

  // An array of integers, each at least `min` (or -1 where `allow_any` says so).
  std::optional<std::vector<int64_t>> integers(std::string_view key, int64_t min, bool allow_any = false) const {
    const toml::node* node = table_.get(key);
    if (!node) return std::nullopt;
    const toml::array* array = node->as_array();
    if (!array) fail(key, "must be an array of integers");
    std::vector<int64_t> values;
    for (const auto& item : *array) {
      auto value = item.value_exact<int64_t>();
      if (!value) fail(key, "must be an array of integers");
      if (*value < min && !(allow_any && *value == -1)) {
        fail(key, fmt::format("entries must be at least {}{}, got {}", min, allow_any ? " or -1" : "", *value));
      }
      values.push_back(*value);
    }
    return values;
  }

 private:
  const toml::table& table_;
  std::string file_;
  std::string prefix_;
};

bool is_floating(DataType type) { return type == DataType::FP16 || type == DataType::FP32 || type == DataType::FP64; }

std::vector<TensorSpec> read_tensor_specs(const toml::table& config, std::string_view key, const std::string& file) {
  const toml::node* node = config.get(key);
  if (!node) throw UsageError(fmt::format("{}: {}", file, key), "missing: at least one [[" + std::string(key) + "]]");
  const toml::array* tables = node->as_array();
  if (!tables || tables->empty() || !tables->is_array_of_tables()) {
    throw UsageError(fmt::format("{}: {}", file, key), "must be one or more [[" + std::string(key) + "]] tables");
  }
  const bool inputs = key == "input";
  std::vector<TensorSpec> specs;
  for (std::size_t i = 0; i < tables->size(); ++i) {
    TableReader reader(*tables->get(i)->as_table(), file, fmt::format("{}[{}].", key, i));
    if (inputs) {
      reader.reject_unknown_keys(
          {"name", "datatype", "dims", "allow_non_finite", "format", "transforms", "mean", "std", "classes_file"});
    } else {
      reader.reject_unknown_keys({"name", "datatype", "dims"});
    }
    TensorSpec spec;
    spec.name = reader.string("name");
    auto datatype = parse_datatype(reader.string("datatype"));
    if (!datatype) reader.fail("datatype", "must be one of BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, FP32, FP64");
    spec.datatype = *datatype;
    auto dims = reader.integers("dims", 1, /*allow_any=*/true);
    if (!dims) reader.fail("dims", "missing");
    spec.dims = *dims;
    if (auto allow = reader.boolean("allow_non_finite")) {
      if (!is_floating(spec.datatype)) {
        reader.fail("allow_non_finite", fmt::format("applies to FP16, FP32 and FP64 inputs, '{}' is {}", spec.name,
                                                    datatype_name(spec.datatype)));
      }
      spec.allow_non_finite = *allow;
    }
    for (const auto& other : specs) {
      if (other.name == spec.name) reader.fail("name", "duplicate name '" + spec.name + "'");
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

// The image input the model file's afterburner.json describes (`train --export`), else the
// defaults: torchvision's Resize(S * 256 / 224) + CenterCrop(S), no normalisation, no names.
ImageInput exported_image_input(const ModelConfig& config, const TensorSpec& spec, const TableReader& reader) {
  const int64_t size = spec.dims[1];
  ImageInput input{fmt::format("resize{},centre{}", size * 256 / 224, size), {}, {}, {}};
  const std::string text = infer::read_model_metadata(config.model_file.string());
  if (text.empty()) return input;
  const nlohmann::json metadata = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string where = fmt::format("{} ({})", config.model_file.string(), infer::kMetadataFile);
  if (!metadata.is_object() || !metadata.contains("input")) throw DataError(where, "not the metadata train --export writes");
  try {
    const nlohmann::json& exported = metadata.at("input");
    const auto shape = exported.at("shape").get<std::vector<int64_t>>();
    if (shape != spec.dims) {
      reader.fail("dims", fmt::format("[{}], but {} was trained on [{}] inputs", fmt::join(spec.dims, ", "),
                                      config.model_file.string(), fmt::join(shape, ", ")));
    }
    input.transforms = exported.value("transforms", input.transforms);
    input.mean = exported.at("mean").get<std::vector<double>>();
    input.std = exported.at("std").get<std::vector<double>>();
    input.classes = metadata.value("classes", std::vector<std::string>{});
  } catch (const nlohmann::json::exception& e) {
    throw DataError(where, std::string("not the metadata train --export writes: ") + e.what());
  }
  return input;
}

// One class name per line, blank lines ignored.
std::vector<std::string> read_class_names(const fs::path& path, const TableReader& reader) {
  std::ifstream in(path);
  if (!in) reader.fail("classes_file", fmt::format("cannot read {}", path.string()));
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  if (names.empty()) reader.fail("classes_file", fmt::format("{} names no class", path.string()));
  return names;
}

void check_image_input(const ImageInput& input, const ModelConfig& config, const TensorSpec& spec,
                       const TableReader& reader) {
  const int64_t channels = spec.dims[0];
  data::parse_image_transforms(input.transforms, reader.key_name("transforms")).decode_options(false, spec.dims[1]);
  for (const auto* values : {&input.mean, &input.std}) {
    const char* key = values == &input.mean ? "mean" : "std";
    if (values->size() != input.mean.size() || (values->size() > 1 && int64_t(values->size()) != channels)) {
      reader.fail(key, fmt::format("{} means and {} stds for {} channels", input.mean.size(), input.std.size(), channels));
    }
  }
  for (double spread : input.std) {
    if (!(spread > 0)) reader.fail("std", fmt::format("{} is not positive", spread));
  }
  const int64_t outputs = config.outputs.front().dims.empty() ? -1 : config.outputs.front().dims.back();
  if (!input.classes.empty() && outputs > 0 && outputs != int64_t(input.classes.size())) {
    reader.fail("classes_file", fmt::format("{} class names for the {} scores of output '{}'", input.classes.size(),
                                            outputs, config.outputs.front().name));
  }
}

// The input that takes images, if the config declares one (format = "image").
std::optional<ImageInput> read_image_input(const toml::table& table, const std::string& file,
                                           const ModelConfig& config) {
  const toml::array& tables = *table.get("input")->as_array();
  std::optional<ImageInput> image;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    TableReader reader(*tables.get(i)->as_table(), file, fmt::format("input[{}].", i));
    const std::string format = reader.optional_string("format").value_or("tensor");
    if (format != "tensor" && format != "image") reader.fail("format", "must be tensor or image, got " + format);
    if (format == "tensor") {
      for (const char* key : {"transforms", "mean", "std", "classes_file"}) {
        if (reader.has(key)) reader.fail(key, "applies to an input with format = \"image\"");
      }
      continue;
    }
    const TensorSpec& spec = config.inputs[i];
    if (tables.size() != 1) reader.fail("format", "an image input must be the model's only input");
    if (spec.datatype != DataType::FP32) reader.fail("datatype", "an image input is FP32");
    if (spec.dims.size() != 3 || (spec.dims[0] != 1 && spec.dims[0] != 3) || spec.dims[1] < 1 ||
        spec.dims[1] != spec.dims[2]) {
      reader.fail("dims", "an image input is [C, S, S] with C 1 or 3");
    }
    ImageInput input = exported_image_input(config, spec, reader);
    input.transforms = reader.optional_string("transforms").value_or(input.transforms);
    input.mean = reader.numbers("mean").value_or(input.mean);
    input.std = reader.numbers("std").value_or(input.std);
    if (auto names = reader.optional_string("classes_file")) {
      input.classes = read_class_names(config.config_file.parent_path() / *names, reader);
    }
    check_image_input(input, config, spec, reader);
    image = std::move(input);
  }
  return image;
}

}  // namespace

std::string_view datatype_name(DataType type) {
  for (const auto& [candidate, name] : kDatatypeNames) {
    if (candidate == type) return name;
  }
  return "?";
}

std::optional<DataType> parse_datatype(std::string_view name) {
  for (const auto& [type, candidate] : kDatatypeNames) {
    if (candidate == name) return type;
  }
  return std::nullopt;
}

std::size_t spec_index(const std::vector<TensorSpec>& specs, std::string_view name) {
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) return i;
  }
  return specs.size();
}

std::size_t datatype_size(DataType type) {
  switch (type) {
    case DataType::BOOL:
    case DataType::UINT8:
    case DataType::INT8: return 1;
    case DataType::INT16:
    case DataType::FP16: return 2;
    case DataType::INT32:
    case DataType::FP32: return 4;
    case DataType::INT64:
    case DataType::FP64: return 8;
  }
  return 0;
}

int64_t ModelConfig::queue_capacity() const {
  return max_queue_size > 0 ? max_queue_size : 2 * max_batch_size * instances;
}

namespace {

// A version directory's number, nullopt for any other name.
std::optional<uint64_t> version_number(const fs::path& dir) {
  const std::string name = dir.filename().string();
  uint64_t number = 0;
  auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), number);
  if (name.empty() || error != std::errc() || end != name.data() + name.size()) return std::nullopt;
  return number;
}

// "path size modification-time" of `file`, or "path missing".
std::string file_stamp(const fs::path& file) {
  std::error_code error;
  const auto size = fs::file_size(file, error);
  if (error) return file.string() + " missing";
  const auto modified = fs::last_write_time(file, error).time_since_epoch().count();
  return fmt::format("{} {} {}", file.string(), size, modified);
}

}  // namespace

std::string ModelFiles::stamp() const { return file_stamp(config_file) + "\n" + file_stamp(model_file); }

ModelFiles locate_model_files(const fs::path& model_dir) {
  ModelFiles files{model_dir.filename().string(), "1", model_dir / "config.toml", model_dir / "model.pt"};
  std::optional<uint64_t> latest;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(model_dir, error)) {
    const std::optional<uint64_t> number = entry.is_directory() ? version_number(entry.path()) : std::nullopt;
    if (number && (!latest || *number > *latest)) {
      latest = number;
      files.version = entry.path().filename().string();
    }
  }
  if (!latest) return files;
  if (fs::exists(files.model_file)) {
    throw DataError(model_dir.string(), "holds both model.pt and version directories: keep one layout");
  }
  files.model_file = model_dir / files.version / "model.pt";
  return files;
}

ModelConfig load_model_config(const fs::path& model_dir) { return load_model_config(locate_model_files(model_dir)); }

ModelConfig load_model_config(const ModelFiles& files) {
  ModelConfig config;
  config.name = files.name;
  config.version = files.version;
  config.config_file = files.config_file;
  config.model_file = files.model_file;
  const std::string file = config.config_file.string();
  if (!fs::is_regular_file(config.config_file)) throw DataError(file, "no such model config");
  toml::table table;
  try {
    table = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw DataError(fmt::format("{}:{}:{}", file, where.line, where.column), std::string(e.description()));
  }
  TableReader reader(table, file, "");
  reader.reject_unknown_keys({"max_batch_size", "max_queue_delay_us", "preferred_batch_sizes", "dynamic_batching",
                              "instances", "max_queue_size", "timeout_us", "input", "output"});
  config.max_batch_size = reader.integer("max_batch_size", 1).value_or(config.max_batch_size);
  config.max_queue_delay_us = reader.integer("max_queue_delay_us", 0).value_or(config.max_queue_delay_us);
  config.dynamic_batching = reader.boolean("dynamic_batching").value_or(config.dynamic_batching);
  config.instances = reader.integer("instances", 1).value_or(config.instances);
  config.max_queue_size = reader.integer("max_queue_size", 1).value_or(config.max_queue_size);
  config.timeout_us = reader.integer("timeout_us", 1).value_or(config.timeout_us);
  config.preferred_batch_sizes = reader.integers("preferred_batch_sizes", 1).value_or(std::vector<int64_t>{});
  for (int64_t size : config.preferred_batch_sizes) {
    if (size > config.max_batch_size) {
      reader.fail("preferred_batch_sizes", fmt::format("{} exceeds max_batch_size {}", size, config.max_batch_size));
    }
  }
  std::sort(config.preferred_batch_sizes.begin(), config.preferred_batch_sizes.end());
  config.preferred_batch_sizes.erase(
      std::unique(config.preferred_batch_sizes.begin(), config.preferred_batch_sizes.end()),
      config.preferred_batch_sizes.end());
  config.inputs = read_tensor_specs(table, "input", file);
  config.outputs = read_tensor_specs(table, "output", file);
  if (!fs::is_regular_file(config.model_file)) throw DataError(config.model_file.string(), "no such model file");
  config.image = read_image_input(table, file, config);
  return config;
}

std::vector<std::string> list_models(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw DataError(dir.string(), "no such model repository directory");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

Repository load_repository(const fs::path& dir) {
  Repository repository{dir, {}};
  for (const std::string& name : list_models(dir)) repository.models.push_back(load_model_config(dir / name));
  if (repository.models.empty()) throw DataError(dir.string(), "no models (expected <name>/config.toml)");
  return repository;
}

}  // namespace afterburner::serve
