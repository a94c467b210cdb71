#include "afterburner/core/archive.h"

#include <zip.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace afterburner {
namespace {

struct ArchiveCloser {
  void operator()(zip_t* archive) const { zip_discard(archive); }
};
struct RecordCloser {
  void operator()(zip_file_t* record) const { zip_fclose(record); }
};

std::string open_error(int code) {
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string text = zip_error_strerror(&error);
  zip_error_fini(&error);
  return text;
}

}  // namespace

void check_archive(const std::string& path) {
  read_archive(path, [](const std::string&, const char*, size_t) {});
}

namespace {

using Archive = std::unique_ptr<zip_t, ArchiveCloser>;

Archive open_archive(const std::string& path) {
  int code = 0;
  // ZIP_CHECKCONS: also the central directory against each record's local header.
  Archive archive(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code));
  if (!archive) {
    throw ArchiveError(path, "not a readable zip archive (" + open_error(code) + "): truncated or of another format");
  }
  return archive;
}

// Reads record `i` through `chunk`, checking its CRC-32 and its declared size.
void read_record(zip_t* archive, zip_int64_t i, const std::string& path, const RecordChunk& chunk) {
  std::vector<char> buffer(1 << 16);
  const char* name = zip_get_name(archive, i, 0);
  const std::string record = name ? name : "#" + std::to_string(i);
  std::unique_ptr<zip_file_t, RecordCloser> file(zip_fopen_index(archive, i, 0));
  if (!file) throw ArchiveError(path, "record " + record + " cannot be read (" + zip_strerror(archive) + ")");
  zip_int64_t read = 0;
  zip_uint64_t total = 0;
  while ((read = zip_fread(file.get(), buffer.data(), buffer.size())) > 0) {
    chunk(record, buffer.data(), static_cast<size_t>(read));
    total += static_cast<zip_uint64_t>(read);
  }
  if (read < 0) {
    zip_error_t* error = zip_file_get_error(file.get());
    if (zip_error_code_zip(error) == ZIP_ER_CRC) throw ArchiveError(path, "record " + record + " fails its CRC-32 check");
    throw ArchiveError(path, "record " + record + " cannot be read (" + zip_error_strerror(error) + ")");
  }
  // LibTorch allocates a record's declared size before reading it: a compressed record whose
  // header promises gigabytes (found by fuzz_checkpoint) must not get that far.
  zip_stat_t stat;
  if (zip_stat_index(archive, i, 0, &stat) == 0 && (stat.valid & ZIP_STAT_SIZE) && stat.size != total) {
    throw ArchiveError(path, "record " + record + " declares " + std::to_string(stat.size) + " bytes but holds " +
                                 std::to_string(total));
  }
}

}  // namespace

void read_archive(const std::string& path, const RecordChunk& chunk) {
  const Archive archive = open_archive(path);
  const zip_int64_t records = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < records; ++i) read_record(archive.get(), i, path, chunk);
}

std::optional<std::string> read_archive_record(const std::string& path, const std::string& suffix) {
  const Archive archive = open_archive(path);
  const zip_int64_t records = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < records; ++i) {
    const char* name = zip_get_name(archive.get(), i, 0);
    const std::string record = name ? name : "";
    if (record.size() < suffix.size() || record.compare(record.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string content;
    read_record(archive.get(), i, path, [&](const std::string&, const char* bytes, size_t size) {
      content.append(bytes, size);
    });
    return content;
  }
  return std::nullopt;
}

}  // namespace afterburner
