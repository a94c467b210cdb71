#include "afterburner/data/idx.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <memory>

#include "afterburner/core/error.h"

namespace afterburner::data {
namespace {

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// zlib reads raw files transparently, so one reader serves both forms.
class IdxReader {
 public:
  explicit IdxReader(const std::string& path) : path_(path) {
    if (!std::filesystem::exists(path)) throw DataError(path, "no such file");
    errno = 0;
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) throw DataError(path, fmt::format("cannot open: {}", std::strerror(errno)));
    gzbuffer(file_.get(), 1 << 20);
  }

  // Reads up to `count` bytes; fewer only at the end of the data.
  int64_t read_some(void* out, int64_t count) {
    auto* bytes = static_cast<char*>(out);
    int64_t done = 0;
    while (done < count) {
      auto chunk = static_cast<unsigned>(std::min<int64_t>(count - done, INT_MAX));
      int got = gzread(file_.get(), bytes + done, chunk);
      if (got < 0) throw DataError(path_, fmt::format("corrupt gzip data: {}", zlib_error()));
      if (got == 0) break;
      done += got;
    }
    // A stream cut short reads as end-of-data with an error set, not as a failed read.
    int code = Z_OK;
    gzerror(file_.get(), &code);
    if (code != Z_OK) throw DataError(path_, fmt::format("corrupt gzip data: {}", zlib_error()));
    return done;
  }

  void read_exactly(void* out, int64_t count, const char* what) {
    int64_t got = read_some(out, count);
    if (got != count) {
      throw DataError(path_, fmt::format("truncated {}: expected {} bytes, got {}", what, count, got));
    }
  }

  // An upper bound on the bytes the file can yield, to reject a corrupt header before
  // allocating for it: deflate expands at most ~1032:1.
  int64_t max_content_bytes() const {
    auto on_disk = static_cast<int64_t>(std::filesystem::file_size(path_));
    return gzdirect(file_.get()) ? on_disk : on_disk * 1032 + 1024;
  }

  bool at_end() {
    char byte;
    return read_some(&byte, 1) == 0;
  }

 private:
  std::string zlib_error() {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    return message && *message ? message : "unknown zlib error";
  }

  std::string path_;
  GzFile file_;
};

uint32_t big_endian_u32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | bytes[3];
}

torch::ScalarType idx_scalar_type(const std::string& path, unsigned char code) {
  switch (code) {
    case 0x08: return torch::kByte;
    case 0x09: return torch::kChar;
    case 0x0B: return torch::kShort;
    case 0x0C: return torch::kInt;
    case 0x0D: return torch::kFloat;
    case 0x0E: return torch::kDouble;
    default: throw DataError(path, fmt::format("unknown IDX element type 0x{:02x}", code));
  }
}

// IDX stores elements big-endian; reverse each element's bytes in place.
void big_endian_to_host(torch::Tensor& tensor) {
  const int64_t width = tensor.element_size();
  if (width == 1) return;
  auto* bytes = static_cast<unsigned char*>(tensor.data_ptr());
  for (int64_t i = 0; i < tensor.numel(); ++i) std::reverse(bytes + i * width, bytes + (i + 1) * width);
}

std::vector<int64_t> read_dims(IdxReader& reader, const std::string& path, int ndim, int64_t element_size) {
  std::vector<unsigned char> raw(4 * ndim);
  reader.read_exactly(raw.data(), static_cast<int64_t>(raw.size()), "header");
  std::vector<int64_t> dims(ndim);
  for (int d = 0; d < ndim; ++d) dims[d] = big_endian_u32(&raw[4 * d]);

  const int64_t limit = reader.max_content_bytes();
  int64_t bytes = element_size;
  for (int64_t dim : dims) {
    // Checked per factor so the product cannot overflow.
    if (dim > 0 && bytes > limit / dim) {
      throw DataError(path, fmt::format("truncated data: the header declares dimensions {} of {}-byte "
                                        "elements, more than the file can hold ({} bytes)",
                                        c10::str(c10::IntArrayRef(dims)), element_size, limit));
    }
    bytes *= dim;
  }
  return dims;
}

std::string mnist_file(const std::string& dir, const std::string& name) {
  auto raw = std::filesystem::path(dir) / name;
  if (std::filesystem::exists(raw)) return raw.string();
  auto gz = std::filesystem::path(dir) / (name + ".gz");
  if (std::filesystem::exists(gz)) return gz.string();
  throw DataError(raw.string(), "no such file (nor a .gz of it)");
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  IdxReader reader(path);
  std::array<unsigned char, 4> magic{};
  reader.read_exactly(magic.data(), magic.size(), "header");
  if (magic[0] != 0 || magic[1] != 0) {
    throw DataError(path, fmt::format("bad magic 0x{:08x}: not an IDX file", big_endian_u32(magic.data())));
  }
  torch::ScalarType type = idx_scalar_type(path, magic[2]);
  if (magic[3] == 0) throw DataError(path, "IDX header declares 0 dimensions");
  std::vector<int64_t> dims = read_dims(reader, path, magic[3], c10::elementSize(type));

  torch::Tensor tensor = torch::empty(dims, torch::TensorOptions().dtype(type));
  reader.read_exactly(tensor.data_ptr(), tensor.nbytes(), "data");
  if (!reader.at_end()) throw DataError(path, "unexpected bytes after the data");
  big_endian_to_host(tensor);
  return tensor;
}

DatasetPtr load_mnist(const std::string& dir, Split split, int64_t classes) {
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string images_path = mnist_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = mnist_file(dir, prefix + "-labels-idx1-ubyte");
  torch::Tensor images = read_idx(images_path);
  torch::Tensor labels = read_idx(labels_path);

  if (images.scalar_type() != torch::kByte || images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) {
    throw DataError(images_path, fmt::format("expected uint8 images [N, 28, 28], got {} {}",
                                             c10::toString(images.scalar_type()), c10::str(images.sizes())));
  }
  if (labels.scalar_type() != torch::kByte || labels.dim() != 1) {
    throw DataError(labels_path, fmt::format("expected uint8 labels [N], got {} {}",
                                             c10::toString(labels.scalar_type()), c10::str(labels.sizes())));
  }
  if (labels.size(0) != images.size(0)) {
    throw DataError(labels_path, fmt::format("{} labels for {} images in {}", labels.size(0), images.size(0),
                                             images_path));
  }
  if (classes > 0) check_labels(labels, classes, labels_path);
  return std::make_shared<TensorDataset>(images.unsqueeze(1), labels);
}

}  // namespace afterburner::data
