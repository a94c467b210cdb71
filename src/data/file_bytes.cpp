#include "file_bytes.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "afterburner/core/error.h"

namespace afterburner::data {

void file_bytes(const std::string& path, std::vector<char>& into) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) {
    throw DataError(path, std::filesystem::exists(path) ? fmt::format("cannot open: {}", std::strerror(errno))
                                                        : "no such file");
  }
  const std::streamoff size = file.tellg();
  if (size < 0) throw DataError(path, fmt::format("cannot read: {}", std::strerror(errno)));
  into.resize(static_cast<size_t>(size));
  file.seekg(0);
  if (size > 0 && !file.read(into.data(), size)) {
    throw DataError(path, fmt::format("cannot read: {}", std::strerror(errno)));
  }
}

std::vector<char> file_bytes(const std::string& path) {
  std::vector<char> bytes;
  file_bytes(path, bytes);
  return bytes;
}

}  // namespace afterburner::data
