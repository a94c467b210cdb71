#include "afterburner/data/sources.h"

#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <filesystem>

#include "afterburner/core/error.h"
#include "afterburner/data/cifar.h"
#include "afterburner/data/csv.h"
#include "afterburner/data/idx.h"
#include "afterburner/data/image_folder.h"
#include "afterburner/data/image_pipeline.h"
#include "afterburner/data/npy.h"
#include "afterburner/data/pack.h"

namespace afterburner::data {
namespace {

namespace fs = std::filesystem;

constexpr DataFormat kFormats[] = {DataFormat::idx, DataFormat::folder, DataFormat::cifar, DataFormat::npy,
                                   DataFormat::csv, DataFormat::pack};

bool is_csv_file(const fs::path& path) {
  std::string extension = path.extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return (extension == ".csv" || extension == ".tsv") && !fs::is_directory(path);
}

// A CSV folder's file for `split`: the one whose name (before .csv) ends with "train", or with
// "test" (else "val") for the test split ("" when there is none, or more than one).
std::string csv_split_file(const fs::path& dir, Split split) {
  std::vector<std::string> found;
  for (const char* suffix : split == Split::train ? std::vector<const char*>{"train"}
                                                  : std::vector<const char*>{"test", "val"}) {
    const size_t length = std::strlen(suffix);
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string stem = entry.path().stem().string();
      const bool named = stem.size() >= length && stem.compare(stem.size() - length, length, suffix) == 0;
      if (named && is_csv_file(entry.path())) found.push_back(entry.path().string());
    }
    if (!found.empty()) break;
  }
  return found.size() == 1 ? found.front() : "";
}

bool is_csv_folder(const fs::path& dir) {
  return !csv_split_file(dir, Split::train).empty() && !csv_split_file(dir, Split::test).empty();
}

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

// The CSV file holding `split` of the dataset at `path`: the file itself, or the folder's file.
std::string csv_file(const std::string& path, Split split) {
  if (!fs::is_directory(path)) return path;
  std::string file = csv_split_file(path, split);
  if (file.empty()) {
    throw DataError(path, fmt::format("expected one CSV file whose name ends with '{}' (before .csv)",
                                      split == Split::train ? "train" : "test"));
  }
  return file;
}

// The pack at `path`, whose classes must be `classes` when they are given (a training set's).
std::shared_ptr<const PackedImages> open_pack(const std::string& path, const std::vector<std::string>& classes) {
  auto pack = std::make_shared<const PackedImages>(path);
  if (!classes.empty() && pack->classes() != classes) {
    throw DataError(path, fmt::format("packs the classes {}, not the training set's {}: pack its folder with "
                                      "--classes-from the training pack",
                                      fmt::join(pack->classes(), ", "), fmt::join(classes, ", ")));
  }
  return pack;
}

}  // namespace

DataFormat parse_data_format(const std::string& name) {
  for (DataFormat format : kFormats) {
    if (name == data_format_name(format)) return format;
  }
  throw UsageError("--data-format",
                   fmt::format("'{}' is not one of idx, folder, cifar, npy, csv, pack (or auto)", name));
}

const char* data_format_name(DataFormat format) {
  switch (format) {
    case DataFormat::idx: return "idx";
    case DataFormat::folder: return "folder";
    case DataFormat::cifar: return "cifar";
    case DataFormat::npy: return "npy";
    case DataFormat::csv: return "csv";
    case DataFormat::pack: return "pack";
  }
  return "unknown";
}

bool has_split_folders(const std::string& dir) {
  const fs::path path(dir);
  return fs::is_directory(path / "train") && (fs::is_directory(path / "val") || fs::is_directory(path / "test"));
}

bool holds_test_split(const std::string& path, DataFormat format) {
  if (format == DataFormat::folder) return has_split_folders(path);
  if (format == DataFormat::csv) return fs::is_directory(path);
  return format != DataFormat::pack;
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
  if (is_csv_file(path)) return DataFormat::csv;
  if (is_pack_file(path)) return DataFormat::pack;
  if (!fs::is_directory(path)) {
    throw DataError(path, "not a dataset: expected a folder (IDX files, CIFAR batches, class folders, .npy "
                          "arrays, train and test CSV files), an .npz archive, a .csv file or an .abpk pack");
  }
  if (is_idx_folder(path)) return DataFormat::idx;
  if (is_cifar_folder(path)) return DataFormat::cifar;
  if (is_csv_folder(path)) return DataFormat::csv;
  if (has_subfolder(path)) return DataFormat::folder;
  throw DataError(path, "no dataset found in it: expected MNIST-layout IDX files, CIFAR binary batches, "
                        "x_train.npy and its kin, a *train.csv and a *test.csv, or one folder of images per class");
}

std::shared_ptr<const ImageRecords> open_image_records(const std::string& path, DataFormat format, Split split,
                                                       const std::vector<std::string>& classes,
                                                       const std::shared_ptr<SkippedInputs>& skipped,
                                                       int64_t min_side) {
  if (format == DataFormat::pack) return open_pack(path, classes);
  if (format != DataFormat::folder) {
    throw UsageError("--decode", fmt::format("each-epoch decodes image folders and packs; {} holds {} data", path,
                                             data_format_name(format)));
  }
  ImageFileList list = list_image_folder(image_folder_split(path, split), classes, skipped.get());
  return std::make_shared<const ImageFiles>(skipped ? readable_images(list, *skipped, min_side) : std::move(list));
}

LabelledDataset load_images(const std::string& path, DataFormat format, Split split, const SourceOptions& options) {
  const int64_t image_size = options.image_size();
  LabelledDataset loaded;
  switch (format) {
    case DataFormat::pack:
      return decode_records(*open_pack(path, options.classes()), image_size, options.skipped().get(), path);
    case DataFormat::folder:
      return load_image_folder(image_folder_split(path, split), ImageFolderOptions()
                                                                   .image_size(image_size)
                                                                   .classes(options.classes())
                                                                   .skipped(options.skipped()));
    case DataFormat::idx: loaded = {load_mnist(path, split, kMnistClasses), numbered_classes(kMnistClasses)}; break;
    case DataFormat::cifar: loaded = load_cifar(path, split); break;
    case DataFormat::npy: loaded = load_array_images(path, split, options.skipped().get()); break;
    case DataFormat::csv:
      loaded = load_csv_table(csv_file(path, split), options.label_column(), options.skipped(), options.classes());
      break;
  }
  if (format == DataFormat::csv && !options.classes().empty()) loaded.classes = options.classes();
  const torch::Tensor first = loaded.dataset->get_batch(torch::zeros({1}, torch::kLong)).input;
  if (image_size > 0 && first.dim() == 2) {
    throw UsageError("--image-size", fmt::format("{} holds a table of {} features, not images", path, first.size(1)));
  }
  const int64_t stored = first.size(-1);
  if (image_size > 0 && image_size != stored) {
    throw UsageError("--image-size", fmt::format("{} stores {}x{} images; resizing applies to image folders only",
                                                 path, stored, stored));
  }
  return loaded;
}

}  // namespace afterburner::data
