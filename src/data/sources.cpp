#include "afterburner/data/sources.h"

#include <fmt/format.h>

#include <filesystem>

#include "afterburner/core/error.h"
#include "afterburner/data/cifar.h"
#include "afterburner/data/idx.h"
#include "afterburner/data/image_folder.h"
#include "afterburner/data/npy.h"

namespace afterburner::data {
namespace {

namespace fs = std::filesystem;

constexpr DataFormat kFormats[] = {DataFormat::idx, DataFormat::folder, DataFormat::cifar, DataFormat::npy};

bool is_idx_folder(const fs::path& dir) {
  return fs::exists(dir / "train-images-idx3-ubyte") || fs::exists(dir / "train-images-idx3-ubyte.gz") ||
         fs::exists(dir / "t10k-images-idx3-ubyte") || fs::exists(dir / "t10k-images-idx3-ubyte.gz");
}

bool has_subfolder(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory()) return true;
  }
  return false;
}

// The MNIST family's classes (MNIST, Fashion-MNIST, KMNIST): a label file's other values are
// corrupt bytes, refused naming the file.
constexpr int64_t kMnistClasses = 10;

}  // namespace

DataFormat parse_data_format(const std::string& name) {
  for (DataFormat format : kFormats) {
    if (name == data_format_name(format)) return format;
  }
  throw UsageError("--data-format", fmt::format("'{}' is not one of idx, folder, cifar, npy (or auto)", name));
}

const char* data_format_name(DataFormat format) {
  switch (format) {
    case DataFormat::idx: return "idx";
    case DataFormat::folder: return "folder";
    case DataFormat::cifar: return "cifar";
    case DataFormat::npy: return "npy";
  }
  return "unknown";
}

bool has_split_folders(const std::string& dir) {
  const fs::path path(dir);
  return fs::is_directory(path / "train") && (fs::is_directory(path / "val") || fs::is_directory(path / "test"));
}

std::string image_folder_split(const std::string& dir, Split split) {
  if (!has_split_folders(dir)) return dir;
  if (split == Split::train) return (fs::path(dir) / "train").string();
  const fs::path val = fs::path(dir) / "val";
  return (fs::is_directory(val) ? val : fs::path(dir) / "test").string();
}

DataFormat detect_data_format(const std::string& path) {
  if (!fs::exists(path)) throw DataError(path, "no such file or folder");
  if (is_array_dataset(path)) return DataFormat::npy;
  if (!fs::is_directory(path)) {
    throw DataError(path, "not a dataset: expected a folder (IDX files, CIFAR batches, class folders, .npy "
                          "arrays) or an .npz archive");
  }
  if (is_idx_folder(path)) return DataFormat::idx;
  if (is_cifar_folder(path)) return DataFormat::cifar;
  if (has_subfolder(path)) return DataFormat::folder;
  throw DataError(path, "no dataset found in it: expected MNIST-layout IDX files, CIFAR binary batches, "
                        "x_train.npy and its kin, or one folder of images per class");
}

LabelledDataset load_images(const std::string& path, DataFormat format, Split split, int64_t image_size,
                            const std::vector<std::string>& classes) {
  LabelledDataset loaded;
  switch (format) {
    case DataFormat::folder:
      return load_image_folder(image_folder_split(path, split), ImageFolderOptions().image_size(image_size).classes(classes));
    case DataFormat::idx: loaded = {load_mnist(path, split, kMnistClasses), numbered_classes(kMnistClasses)}; break;
    case DataFormat::cifar: loaded = load_cifar(path, split); break;
    case DataFormat::npy: loaded = load_array_images(path, split); break;
  }
  const int64_t stored = loaded.dataset->get_batch(torch::zeros({1}, torch::kLong)).input.size(-1);
  if (image_size > 0 && image_size != stored) {
    throw UsageError("--image-size", fmt::format("{} stores {}x{} images; resizing applies to image folders only",
                                                 path, stored, stored));
  }
  return loaded;
}

}  // namespace afterburner::data
