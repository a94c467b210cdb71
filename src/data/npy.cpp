#include "afterburner/data/npy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "afterburner/core/archive.h"
#include "afterburner/core/error.h"
#include "file_bytes.h"

namespace afterburner::data {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

torch::ScalarType npy_scalar_type(const std::string& descr, const std::string& source) {
  static const std::map<std::string, torch::ScalarType> types{
      {"b1", torch::kBool}, {"i1", torch::kChar}, {"u1", torch::kByte},   {"i2", torch::kShort},
      {"i4", torch::kInt},  {"i8", torch::kLong}, {"f2", torch::kHalf},   {"f4", torch::kFloat},
      {"f8", torch::kDouble}};
  const auto found = descr.size() == 3 ? types.find(descr.substr(1)) : types.end();
  if (found == types.end() || std::string("<>|=").find(descr[0]) == std::string::npos) {
    throw DataError(source, fmt::format("dtype '{}' is not read (bool, int8-64, uint8, float16-64 are)", descr));
  }
  return found->second;
}

// The value of 'key' in the header's dict literal, up to the next top-level ',' or '}'.
std::string header_field(const std::string& header, const std::string& key, const std::string& source) {
  const size_t at = header.find("'" + key + "'");
  const size_t colon = at == std::string::npos ? at : header.find(':', at);
  if (colon == std::string::npos) throw DataError(source, fmt::format("bad .npy header: no '{}' in {}", key, header));
  size_t end = colon + 1;
  for (int depth = 0; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string value = header.substr(colon + 1, end - colon - 1);
  value.erase(0, value.find_first_not_of(" "));
  value.erase(value.find_last_not_of(" ") + 1);
  return value;
}

std::vector<int64_t> parse_shape(const std::string& text, const std::string& source) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    throw DataError(source, fmt::format("bad .npy header: shape {}", text));
  }
  std::vector<int64_t> shape;
  size_t at = 1;
  while (at < text.size() - 1) {
    const size_t comma = std::min(text.find(',', at), text.size() - 1);
    std::string item = text.substr(at, comma - at);
    item.erase(0, item.find_first_not_of(" "));
    item.erase(item.find_last_not_of(" ") + 1);
    if (!item.empty()) {
      if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 15) {
        throw DataError(source, fmt::format("bad .npy header: shape {}", text));
      }
      shape.push_back(std::stoll(item));
    }
    at = comma + 1;
  }
  return shape;
}

torch::Tensor parse_npy(const std::vector<char>& bytes, const std::string& source) {
  if (bytes.size() < kMagicSize + 4 || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0) {
    throw DataError(source, "not a .npy array (bad magic)");
  }
  const auto major = static_cast<uint8_t>(bytes[6]);
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3 || bytes.size() < 8 + length_bytes) {
    throw DataError(source, fmt::format("unknown .npy version {}", major));
  }
  size_t header_length = 0;
  for (size_t i = 0; i < length_bytes; ++i) header_length |= size_t(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
  const size_t data_start = 8 + length_bytes + header_length;
  if (data_start > bytes.size()) throw DataError(source, "truncated .npy header");
  const std::string header(bytes.data() + 8 + length_bytes, header_length);
  std::string descr = header_field(header, "descr", source);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"')) {
    throw DataError(source, fmt::format("dtype {} is not read (structured arrays are not)", descr));
  }
  descr = descr.substr(1, descr.size() - 2);
  const torch::ScalarType type = npy_scalar_type(descr, source);
  const bool fortran = header_field(header, "fortran_order", source) == "True";
  std::vector<int64_t> shape = parse_shape(header_field(header, "shape", source), source);
  const int64_t item = static_cast<int64_t>(c10::elementSize(type));
  int64_t count = 1;
  const auto available = static_cast<int64_t>(bytes.size() - data_start);
  for (int64_t dim : shape) {
    if (dim > 0 && count > available / item / dim) {
      throw DataError(source, fmt::format("truncated data: shape {} needs more than the file's {} bytes",
                                          c10::str(c10::IntArrayRef(shape)), available));
    }
    count *= dim;
  }
  if (count * item != available) {
    throw DataError(source, fmt::format("{} data: shape {} of {}-byte elements needs {} bytes, the file has {}",
                                        count * item > available ? "truncated" : "trailing",
                                        c10::str(c10::IntArrayRef(shape)), item, count * item, available));
  }
  if (fortran) std::reverse(shape.begin(), shape.end());
  torch::Tensor tensor = torch::empty(shape, type);
  if (count > 0) std::memcpy(tensor.data_ptr(), bytes.data() + data_start, static_cast<size_t>(count * item));
  if (descr[0] == '>' && item > 1) {
    auto* raw = static_cast<char*>(tensor.data_ptr());
    for (int64_t i = 0; i < count; ++i) std::reverse(raw + i * item, raw + (i + 1) * item);
  }
  if (fortran) {
    std::vector<int64_t> reversed(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) reversed[d] = static_cast<int64_t>(shape.size() - 1 - d);
    tensor = tensor.permute(reversed).contiguous();
  }
  return tensor;
}

// [N, C, H, W] uint8 images from an array of one of the documented layouts.
torch::Tensor as_images(const torch::Tensor& array, const std::string& source) {
  if (array.scalar_type() != torch::kByte) {
    throw DataError(source, fmt::format("{} images: store the pixels as uint8 (0-255)",
                                        c10::toString(array.scalar_type())));
  }
  const auto channels = [](int64_t c) { return c == 1 || c == 3; };
  if (array.dim() == 3 && array.size(1) == array.size(2)) return array.unsqueeze(1);
  if (array.dim() == 4 && channels(array.size(1)) && array.size(2) == array.size(3)) return array;
  if (array.dim() == 4 && channels(array.size(3)) && array.size(1) == array.size(2)) {
    return array.permute({0, 3, 1, 2}).contiguous();
  }
  throw DataError(source, fmt::format("images of shape {}: expected [N, H, W], [N, H, W, C] or [N, C, H, W] with "
                                      "H = W and C of 1 or 3", c10::str(array.sizes())));
}

}  // namespace

torch::Tensor read_npy(const std::string& path) { return parse_npy(file_bytes(path), path); }

std::map<std::string, torch::Tensor> read_npz(const std::string& path) {
  if (!fs::exists(path)) throw DataError(path, "no such file");
  std::map<std::string, std::vector<char>> records;
  read_archive(path, [&](const std::string& record, const char* bytes, size_t size) {
    std::vector<char>& content = records[record];
    content.insert(content.end(), bytes, bytes + size);
  });
  std::map<std::string, torch::Tensor> arrays;
  for (const auto& [record, bytes] : records) {
    std::string name = record;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    arrays[name] = parse_npy(bytes, path + ":" + record);
  }
  return arrays;
}

bool is_array_dataset(const std::string& path) {
  return fs::path(path).extension() == ".npz" || fs::exists(fs::path(path) / "x_train.npy");
}

LabelledDataset load_array_images(const std::string& path, Split split, SkippedInputs* skipped) {
  const std::string suffix = split == Split::train ? "train" : "test";
  const bool archive = fs::path(path).extension() == ".npz";
  std::map<std::string, torch::Tensor> arrays;
  if (archive) arrays = read_npz(path);
  // Where each array comes from, for errors; the training labels give the class count.
  const auto array = [&](const std::string& name) -> std::pair<torch::Tensor, std::string> {
    if (!archive) {
      const std::string file = (fs::path(path) / (name + ".npy")).string();
      return {read_npy(file), file};
    }
    const auto found = arrays.find(name);
    if (found == arrays.end()) throw DataError(path, fmt::format("no array '{}' in the archive", name));
    return {found->second, path + ":" + name};
  };
  auto [x, x_source] = array("x_" + suffix);
  auto [y, y_source] = array("y_" + suffix);
  if (y.dim() != 1 || !c10::isIntegralType(y.scalar_type(), /*includeBool=*/false)) {
    throw DataError(y_source, fmt::format("labels must be a 1-D integer array, got {} {}",
                                          c10::toString(y.scalar_type()), c10::str(y.sizes())));
  }
  torch::Tensor images = as_images(x, x_source);
  if (y.size(0) != images.size(0)) {
    throw DataError(y_source, fmt::format("{} labels for {} images in {}", y.size(0), images.size(0), x_source));
  }
  if (images.size(0) == 0) throw DataError(x_source, "no images (0 rows)");
  torch::Tensor labels = y.to(torch::kLong);
  const torch::Tensor training_labels = split == Split::train ? labels : array("y_train").first.to(torch::kLong);
  const std::vector<std::string> classes = classes_up_to_largest(training_labels, y_source);
  const torch::Tensor kept = check_labels(labels, static_cast<int64_t>(classes.size()), y_source, skipped);
  if (kept.numel() == 0) throw DataError(y_source, "none of its labels is a class");
  if (kept.numel() < labels.numel()) {
    images = images.index_select(0, kept);
    labels = labels.index_select(0, kept);
  }
  return {std::make_shared<TensorDataset>(images, labels), classes};
}

}  // namespace afterburner::data
