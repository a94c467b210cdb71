#include "afterburner/data/image_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <utility>

#include "afterburner/core/error.h"
#include "afterburner/data/image_records.h"

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
  const ImageFiles files(list_image_folder(dir, options.classes(), options.skipped().get()));
  return decode_records(files, options.image_size(), options.skipped().get(), dir);
}

}  // namespace afterburner::data
