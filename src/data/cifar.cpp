#include "afterburner/data/cifar.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "afterburner/core/error.h"
#include "file_bytes.h"

namespace afterburner::data {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPixelBytes = 3 * 32 * 32;

struct CifarKind {
  std::vector<std::string> train_files, test_files;
  int64_t label_bytes;  // the label used is the last of them (CIFAR-100's fine label)
  int64_t classes;
  const char* names_file;
};

CifarKind cifar_kind(const fs::path& dir) {
  if (fs::exists(dir / "train.bin") || fs::exists(dir / "test.bin")) {
    return {{"train.bin"}, {"test.bin"}, 2, 100, "fine_label_names.txt"};
  }
  std::vector<std::string> train;
  for (int i = 1; fs::exists(dir / fmt::format("data_batch_{}.bin", i)); ++i) {
    train.push_back(fmt::format("data_batch_{}.bin", i));
  }
  if (train.empty()) train.push_back("data_batch_1.bin");  // named as missing when read
  return {train, {"test_batch.bin"}, 1, 10, "batches.meta.txt"};
}

// Class names, one per non-empty line; numbered when the file is absent or names another count.
std::vector<std::string> class_names(const fs::path& path, int64_t classes) {
  std::ifstream file(path);
  std::vector<std::string> names;
  for (std::string line; std::getline(file, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  return static_cast<int64_t>(names.size()) == classes ? names : numbered_classes(classes);
}

}  // namespace

bool is_cifar_folder(const std::string& dir) {
  const fs::path path(dir);
  return fs::exists(path / "data_batch_1.bin") || fs::exists(path / "test_batch.bin") ||
         fs::exists(path / "train.bin") || fs::exists(path / "test.bin");
}

LabelledDataset load_cifar(const std::string& dir, Split split) {
  if (!fs::is_directory(dir)) throw DataError(dir, fs::exists(dir) ? "not a folder" : "no such folder");
  const CifarKind kind = cifar_kind(dir);
  const int64_t record = kind.label_bytes + kPixelBytes;
  std::vector<torch::Tensor> images, labels;
  for (const std::string& name : split == Split::train ? kind.train_files : kind.test_files) {
    const fs::path path = fs::path(dir) / name;
    std::vector<char> bytes = file_bytes(path.string());
    const auto size = static_cast<int64_t>(bytes.size());
    if (size == 0 || size % record != 0) {
      throw DataError(path.string(), fmt::format("{} bytes: not a whole number of {}-byte records", size, record));
    }
    torch::Tensor records = torch::from_blob(bytes.data(), {size / record, record}, torch::kByte).clone();
    torch::Tensor label = records.select(1, kind.label_bytes - 1).to(torch::kLong);
    check_labels(label, kind.classes, path.string());
    labels.push_back(label);
    images.push_back(records.narrow(1, kind.label_bytes, kPixelBytes).reshape({-1, 3, 32, 32}));
  }
  return {std::make_shared<TensorDataset>(torch::cat(images), torch::cat(labels)),
          class_names(fs::path(dir) / kind.names_file, kind.classes)};
}

}  // namespace afterburner::data
