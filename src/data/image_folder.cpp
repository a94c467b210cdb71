#include "afterburner/data/image_folder.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <utility>

#include "afterburner/core/error.h"
#include "afterburner/data/image_file.h"

namespace afterburner::data {
namespace {

namespace fs = std::filesystem;

std::string lowercase_extension(const fs::path& file) {
  std::string extension = file.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension;
}

// Whether ImageFolder would read the file: ours to decode, or refused in one line.
bool is_image_file(const fs::path& file) {
  static const std::set<std::string> decoded{".jpg", ".jpeg", ".png"};
  static const std::set<std::string> refused{".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp"};
  const std::string extension = lowercase_extension(file);
  if (refused.count(extension)) {
    throw DataError(file.string(), fmt::format("{} images are not read (JPEG and PNG are): convert it to PNG",
                                               extension.substr(1)));
  }
  return decoded.count(extension) > 0;
}

std::vector<std::string> subfolder_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The class's image files in os.walk's sorted order (by folder, then file name), as ImageFolder;
// files of a refused format recorded in `skipped` when it is given.
std::vector<fs::path> image_files(const fs::path& class_dir, SkippedInputs* skipped) {
  std::vector<std::pair<std::string, std::string>> found;
  for (const auto& entry : fs::recursive_directory_iterator(class_dir, fs::directory_options::follow_directory_symlink)) {
    bool image = false;
    if (entry.is_regular_file() && skip_or_throw(skipped, [&] { image = is_image_file(entry.path()); }) && image) {
      found.emplace_back(entry.path().parent_path().string(), entry.path().filename().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> files;
  for (const auto& [folder, name] : found) files.push_back(fs::path(folder) / name);
  return files;
}

// torchvision's Resize(size) on a uint8 tensor (shorter side to `size`, the longer one scaled and
// truncated, bilinear with antialiasing, rounded) and CenterCrop(size).
torch::Tensor resized_and_cropped(const torch::Tensor& image, int64_t size) {
  const int64_t height = image.size(1), width = image.size(2);
  const bool portrait = height > width;
  const int64_t shorter = portrait ? width : height, longer = portrait ? height : width;
  const int64_t scaled = size * longer / shorter;
  const std::vector<int64_t> output = portrait ? std::vector<int64_t>{scaled, size} : std::vector<int64_t>{size, scaled};
  torch::Tensor resized = image;
  if (output[0] != height || output[1] != width) {
    resized = at::_upsample_bilinear2d_aa(image.unsqueeze(0).to(torch::kFloat), output, /*align_corners=*/false)
                  .squeeze(0)
                  .round_()
                  .clamp_(0, 255)
                  .to(torch::kByte);
  }
  // CenterCrop's offsets: int(round((side - size) / 2.0)), Python's round half to even.
  const auto offset = [size](int64_t side) { return static_cast<int64_t>(std::nearbyint((side - size) / 2.0)); };
  return resized.narrow(1, offset(output[0]), size).narrow(2, offset(output[1]), size);
}

// Drops the files that were skipped (no image decoded) from `list` and `images`, in order.
void keep_decoded(const std::string& dir, ImageFileList& list, std::vector<torch::Tensor>& images) {
  size_t kept = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!images[i].defined()) continue;
    if (kept != i) {  // a self-move would empty the path
      images[kept] = std::move(images[i]);
      list.paths[kept] = std::move(list.paths[i]);
      list.labels[kept] = list.labels[i];
    }
    ++kept;
  }
  if (kept == 0) throw DataError(dir, "none of its images could be read");
  images.resize(kept);
  list.paths.resize(kept);
  list.labels.resize(kept);
}

}  // namespace

ImageFileList list_image_folder(const std::string& dir, const std::vector<std::string>& known_classes,
                                SkippedInputs* skipped) {
  if (!fs::is_directory(dir)) throw DataError(dir, fs::exists(dir) ? "not a folder" : "no such folder");
  const std::vector<std::string> found = subfolder_names(dir);
  if (found.empty()) throw DataError(dir, "no class folders in it (expected one folder of images per class)");
  ImageFileList list;
  list.classes = known_classes.empty() ? found : known_classes;
  for (const std::string& name : found) {
    const std::string class_dir = (fs::path(dir) / name).string();
    const auto known = std::find(list.classes.begin(), list.classes.end(), name);
    std::vector<fs::path> images;
    skip_or_throw(skipped, [&] {
      if (known == list.classes.end()) {
        throw DataError(class_dir, fmt::format("a class the training images do not have ({})",
                                               fmt::join(list.classes, ", ")));
      }
      images = image_files(class_dir, skipped);
      if (images.empty()) throw DataError(class_dir, "a class folder with no JPEG or PNG image");
    });
    for (const fs::path& image : images) list.paths.push_back(image.string());
    list.labels.insert(list.labels.end(), images.size(), known - list.classes.begin());
  }
  if (list.paths.empty()) throw DataError(dir, "no JPEG or PNG image in its class folders");
  return list;
}

LabelledDataset load_image_folder(const std::string& dir, const ImageFolderOptions& options) {
  ImageFileList list = list_image_folder(dir, options.classes(), options.skipped().get());
  std::vector<torch::Tensor> images(list.paths.size());
  std::vector<std::string> errors(images.size());  // recorded in file order, whichever thread met them
  at::parallel_for(0, static_cast<int64_t>(images.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        torch::Tensor image = decode_image_file(list.paths[i]);
        images[i] = options.image_size() > 0 ? resized_and_cropped(image, options.image_size()) : image;
      } catch (const DataError& error) {
        if (options.skipped() == nullptr) throw;
        errors[i] = error.what();
      }
    }
  });
  for (const std::string& error : errors) {
    if (!error.empty()) options.skipped()->add(error);
  }
  keep_decoded(dir, list, images);
  const std::vector<std::string>& files = list.paths;
  const torch::Tensor& first = images.front();
  int64_t channels = 1;
  for (size_t i = 0; i < images.size(); ++i) {
    const torch::Tensor& image = images[i];
    if (image.size(1) != image.size(2)) {
      throw DataError(files[i], fmt::format("{}x{} pixels, not square: give --image-size S to resize and centre-crop "
                                            "the images to S x S",
                                            image.size(2), image.size(1)));
    }
    if (image.size(1) != first.size(1)) {
      throw DataError(files[i], fmt::format("{}x{} pixels, {} {}x{}: images of several sizes need --image-size S to "
                                            "be resized to one",
                                            image.size(2), image.size(1), files.front(), first.size(2), first.size(1)));
    }
    channels = std::max(channels, image.size(0));
  }
  torch::Tensor batch = torch::empty({static_cast<int64_t>(images.size()), channels, first.size(1), first.size(2)},
                                     torch::kByte);
  at::parallel_for(0, batch.size(0), 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) batch[i].copy_(images[i].expand({channels, -1, -1}));
  });
  return {std::make_shared<TensorDataset>(batch, torch::tensor(list.labels, torch::kLong)), list.classes};
}

}  // namespace afterburner::data
