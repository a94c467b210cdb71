#include "afterburner/data/pack.h"

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/data/image_folder.h"
#include "file_bytes.h"

namespace afterburner::data {
namespace {

namespace fs = std::filesystem;

constexpr char kPackMagic[8] = {'A', 'B', 'P', 'K', '\r', '\n', 0x1A, '\n'};
constexpr char kPartialPackMagic[8] = {'A', 'B', 'P', 'K', 'P', 'A', 'R', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kRecordMagic = 0x43524241;  // "ABRC"
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kBlockBytes = uint64_t{4} << 20;
constexpr size_t kRecordHeaderBytes = 32, kEntryBytes = 32;
constexpr uint32_t kRawFlag = 1;

enum class Format : uint8_t { jpeg = 1, png = 2, raw = 3 };

// A record's fields, as its header in the data and its entry in the index hold them.
struct RecordHeader {
  uint64_t offset = 0;  // of the record header, in the file
  uint32_t source = 0;  // the index of its image in the folder's listing
  int32_t label = 0;
  Format format = Format::jpeg;
  uint8_t channels = 0;  // raw records: 1 or 3
  uint32_t width = 0, height = 0, payload = 0, crc = 0;
};

// Little-endian fields at a cursor (x86 and ARM hosts are little-endian: memcpy is the encoding).
template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

template <typename T>
T get(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

uint32_t crc_of(const uint8_t* bytes, size_t size) {
  return static_cast<uint32_t>(crc32(crc32(0, nullptr, 0), bytes, static_cast<uInt>(size)));
}

// The 32 bytes of a record header in the data; `entry` adds the offset instead of the magic and
// source, for the index.
std::vector<uint8_t> encode_header(const RecordHeader& r, bool entry) {
  std::vector<uint8_t> out;
  if (entry) {
    put<uint64_t>(out, r.offset);
  } else {
    put<uint32_t>(out, kRecordMagic);
    put<uint32_t>(out, r.source);
  }
  put<int32_t>(out, r.label);
  put<uint8_t>(out, static_cast<uint8_t>(r.format));
  put<uint8_t>(out, r.channels);
  put<uint16_t>(out, 0);
  put<uint32_t>(out, r.width);
  put<uint32_t>(out, r.height);
  put<uint32_t>(out, r.payload);
  put<uint32_t>(out, r.crc);
  return out;
}

// The fields after the first 8 bytes, which encode_header wrote.
RecordHeader decode_fields(const uint8_t* at) {
  RecordHeader r;
  r.label = get<int32_t>(at + 8);
  r.format = static_cast<Format>(at[12]);
  r.channels = at[13];
  r.width = get<uint32_t>(at + 16);
  r.height = get<uint32_t>(at + 20);
  r.payload = get<uint32_t>(at + 24);
  r.crc = get<uint32_t>(at + 28);
  return r;
}

// Where a record of `bytes` (header and payload) is written when the data so far ends at `end`:
// there, unless it would cross into the next block, whose start it then takes.
uint64_t placed(uint64_t end, uint64_t bytes) {
  const uint64_t used = end % kBlockBytes;
  return used != 0 && used + bytes > kBlockBytes ? end - used + kBlockBytes : end;
}

std::string errno_text() { return std::strerror(errno); }

[[noreturn]] void cannot_write(const std::string& path) {
  throw FileWriteError(path, "cannot write: " + errno_text());
}

// What a pack holds, written into its header page (and a partial pack's, to resume only the same).
std::string identity(const std::string& source, const PackOptions& options) {
  return fmt::format("source={}\nmax_side={}\nquality={}\nraw={}\nclasses={}\n", fs::absolute(source).string(),
                     options.max_side(), options.quality(), options.raw(), fmt::join(options.classes(), "/"));
}

// One image of the folder as the pack stores it.
struct PackedImage {
  std::vector<uint8_t> payload;
  Format format = Format::jpeg;
  int64_t width = 0, height = 0, channels = 0;
};

// The pixels with the longer side brought down to max_side (the torchvision tensor Resize: the
// antialiased bilinear filter, rounded), unchanged when it is not larger.
Pixels fitted(const Pixels& pixels, int64_t max_side) {
  const int64_t longer = std::max(pixels.width, pixels.height);
  if (max_side <= 0 || longer <= max_side) return pixels;
  const auto scaled = [&](int64_t side) {
    return std::max<int64_t>(1, std::llround(double(side) * max_side / longer));
  };
  const int64_t width = scaled(pixels.width), height = scaled(pixels.height);
  const torch::Tensor chw = torch::from_blob(const_cast<uint8_t*>(pixels.hwc.data()),
                                             {pixels.height, pixels.width, pixels.channels}, torch::kByte)
                                .permute({2, 0, 1})
                                .unsqueeze(0)
                                .to(torch::kFloat);
  const torch::Tensor resized = at::_upsample_bilinear2d_aa(chw, {height, width}, /*align_corners=*/false)
                                    .round_()
                                    .clamp_(0, 255)
                                    .to(torch::kByte)
                                    .squeeze(0)
                                    .permute({1, 2, 0})
                                    .contiguous();
  Pixels out;
  out.width = width;
  out.height = height;
  out.channels = pixels.channels;
  out.hwc.assign(resized.data_ptr<uint8_t>(), resized.data_ptr<uint8_t>() + resized.numel());
  return out;
}

PackedImage pack_image(const std::string& path, const PackOptions& options) {
  std::vector<char> file = file_bytes(path);
  const auto* bytes = reinterpret_cast<const uint8_t*>(file.data());
  const ImageSize stored = read_image_size(bytes, file.size(), path);
  PackedImage image;
  if (!options.raw() && (options.max_side() <= 0 || std::max(stored.width, stored.height) <= options.max_side())) {
    Pixels check;
    decode_pixels(bytes, file.size(), path, 1, check);  // a corrupt file is refused now, not when training
    image.format = stored.partial_decoding ? Format::jpeg : Format::png;
    image.width = stored.width;
    image.height = stored.height;
    image.payload.assign(bytes, bytes + file.size());
    return image;
  }
  const Pixels pixels = fitted(decode_pixels(bytes, file.size(), path), options.max_side());
  image.width = pixels.width;
  image.height = pixels.height;
  if (options.raw()) {
    image.format = Format::raw;
    image.channels = pixels.channels;
    image.payload = pixels.hwc;
  } else {
    image.payload = encode_jpeg(pixels, static_cast<int>(options.quality()), path);
  }
  return image;
}

// The start of a partial pack's header page: its magic, then the length and CRC-32 of what it
// packs (identity()), which a run must match to resume it.
std::vector<uint8_t> partial_header(const std::string& identity) {
  std::vector<uint8_t> header(kPartialPackMagic, kPartialPackMagic + sizeof(kPartialPackMagic));
  put<uint32_t>(header, static_cast<uint32_t>(identity.size()));
  put<uint32_t>(header, crc_of(reinterpret_cast<const uint8_t*>(identity.data()), identity.size()));
  return header;
}

// The `.partial` file being written: its header page names what it packs; records are appended.
class PackWriter {
 public:
  PackWriter(const std::string& path, const std::string& identity) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) cannot_write(path);
    if (!resume(identity)) start(identity);
  }
  ~PackWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  PackWriter(const PackWriter&) = delete;
  PackWriter& operator=(const PackWriter&) = delete;

  // The listing index after the last whole record found on opening (0: a new pack).
  int64_t next_source() const { return records_.empty() ? 0 : int64_t{records_.back().source} + 1; }
  int64_t records() const { return static_cast<int64_t>(records_.size()); }

  void append(uint32_t source, int64_t label, const PackedImage& image) {
    RecordHeader r;
    r.source = source;
    r.label = static_cast<int32_t>(label);
    r.format = image.format;
    r.channels = static_cast<uint8_t>(image.channels);
    r.width = static_cast<uint32_t>(image.width);
    r.height = static_cast<uint32_t>(image.height);
    r.payload = static_cast<uint32_t>(image.payload.size());
    r.crc = crc_of(image.payload.data(), image.payload.size());
    r.offset = placed(end_, kRecordHeaderBytes + r.payload);
    std::vector<uint8_t> bytes = encode_header(r, false);
    bytes.insert(bytes.end(), image.payload.begin(), image.payload.end());
    write_at(r.offset, bytes);
    end_ = r.offset + bytes.size();
    records_.push_back(r);
  }

  // Writes the index, the classes and the header page, and renames the file to `output`.
  uint64_t finish(const std::vector<std::string>& classes, const PackOptions& options, const std::string& output) {
    std::vector<uint8_t> tail;
    const uint64_t index_offset = end_;
    for (const RecordHeader& r : records_) {
      const std::vector<uint8_t> entry = encode_header(r, true);
      tail.insert(tail.end(), entry.begin(), entry.end());
    }
    const uint64_t classes_offset = index_offset + tail.size();
    put<uint32_t>(tail, static_cast<uint32_t>(classes.size()));
    for (const std::string& name : classes) {
      put<uint32_t>(tail, static_cast<uint32_t>(name.size()));
      tail.insert(tail.end(), name.begin(), name.end());
    }
    const uint64_t total_bytes = index_offset + tail.size();
    write_at(index_offset, tail);
    if (::ftruncate(fd_, static_cast<off_t>(total_bytes)) != 0) cannot_write(path_);
    std::vector<uint8_t> header(kPackMagic, kPackMagic + sizeof(kPackMagic));
    put<uint32_t>(header, kVersion);
    put<uint32_t>(header, options.raw() ? kRawFlag : 0);
    put<uint64_t>(header, records_.size());
    put<uint64_t>(header, index_offset);
    put<uint64_t>(header, classes_offset);
    put<uint64_t>(header, total_bytes);
    put<int32_t>(header, static_cast<int32_t>(options.max_side()));
    put<int32_t>(header, static_cast<int32_t>(options.quality()));
    put<uint32_t>(header, static_cast<uint32_t>(kBlockBytes));
    put<uint32_t>(header, crc_of(header.data(), header.size()));
    header.resize(kHeaderBytes, 0);
    if (::fsync(fd_) != 0) cannot_write(path_);
    write_at(0, header);  // last: until now the file reads as a partial pack
    if (::fsync(fd_) != 0) cannot_write(path_);
    if (std::rename(path_.c_str(), output.c_str()) != 0) cannot_write(output);
    return total_bytes;
  }

 private:
  void write_at(uint64_t offset, const std::vector<uint8_t>& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t wrote = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) throw FileWriteError(path_, "cannot write: " + (wrote < 0 ? errno_text() : "no space written"));
      done += static_cast<size_t>(wrote);
    }
  }

  void start(const std::string& identity) {
    if (::ftruncate(fd_, 0) != 0) cannot_write(path_);
    std::vector<uint8_t> header = partial_header(identity);
    header.resize(kHeaderBytes, 0);
    write_at(0, header);
    end_ = kHeaderBytes;
  }

  // Keeps the whole records of an earlier run over the same source and options: each header and
  // payload read back and checked, up to the first that is not (a run killed while writing it),
  // where the file is cut. Returns false when the file holds another pack or none.
  bool resume(const std::string& identity) {
    struct stat status {};
    if (::fstat(fd_, &status) != 0) cannot_write(path_);
    const auto size = static_cast<uint64_t>(status.st_size);
    if (size < kHeaderBytes) return false;
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd_, 0);  // read, not copied: it may be GBs
    if (mapped == MAP_FAILED) cannot_write(path_);
    const auto* bytes = static_cast<const uint8_t*>(mapped);
    const std::vector<uint8_t> expected = partial_header(identity);
    if (std::memcmp(bytes, expected.data(), expected.size()) != 0) {
      ::munmap(mapped, size);
      return false;
    }
    uint64_t end = kHeaderBytes;  // of the last whole record
    while (true) {
      uint64_t at = end;
      if (at + 4 <= size && get<uint32_t>(bytes + at) == 0 && at % kBlockBytes != 0) {
        at = at - at % kBlockBytes + kBlockBytes;  // the padding before a record that starts a block
      }
      if (at + kRecordHeaderBytes > size || get<uint32_t>(bytes + at) != kRecordMagic) break;
      RecordHeader r = decode_fields(bytes + at);
      r.offset = at;
      r.source = get<uint32_t>(bytes + at + 4);
      if (at + kRecordHeaderBytes + r.payload > size || placed(end, kRecordHeaderBytes + r.payload) != at ||
          (!records_.empty() && r.source <= records_.back().source) ||
          crc_of(bytes + at + kRecordHeaderBytes, r.payload) != r.crc) {
        break;
      }
      records_.push_back(r);
      end = at + kRecordHeaderBytes + r.payload;
    }
    ::munmap(mapped, size);
    if (::ftruncate(fd_, static_cast<off_t>(end)) != 0) cannot_write(path_);
    end_ = end;
    return true;
  }

  std::string path_;
  int fd_ = -1;
  uint64_t end_ = kHeaderBytes;
  std::vector<RecordHeader> records_;
};

}  // namespace

bool is_pack_file(const std::string& path) {
  return fs::path(path).extension() == ".abpk" && !fs::is_directory(path);
}

PackSummary pack_image_folder(const std::string& source, const std::string& output, const PackOptions& options,
                              const std::function<void(int64_t, int64_t)>& progress) {
  if (options.max_side() < 0) throw UsageError("--max-side", fmt::format("{} is negative", options.max_side()));
  if (options.quality() < 1 || options.quality() > 100) {
    throw UsageError("--quality", fmt::format("{} is not in 1..100", options.quality()));
  }
  const ImageFileList list = list_image_folder(source, options.classes(), options.skipped().get());
  PackWriter writer(output + ".partial", identity(source, options));
  PackSummary summary;
  summary.resumed = writer.records();
  const auto total = static_cast<int64_t>(list.paths.size());
  // Images are prepared in parallel a chunk at a time and appended in listing order.
  constexpr int64_t kChunk = 64;
  for (int64_t first = writer.next_source(); first < total; first += kChunk) {
    const int64_t count = std::min(kChunk, total - first);
    std::vector<PackedImage> images(static_cast<size_t>(count));
    std::vector<std::string> errors(static_cast<size_t>(count));
    at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        try {
          images[i] = pack_image(list.paths[first + i], options);
        } catch (const DataError& error) {
          if (options.skipped() == nullptr) throw;
          errors[i] = error.what();
        }
      }
    });
    for (int64_t i = 0; i < count; ++i) {
      if (!errors[i].empty()) {
        options.skipped()->add(errors[i]);
        continue;
      }
      writer.append(static_cast<uint32_t>(first + i), list.labels[first + i], images[i]);
    }
    if (progress) progress(first + count, total);
  }
  if (writer.records() == 0) throw DataError(source, "none of its images could be read: nothing packed");
  summary.records = writer.records();
  summary.bytes = static_cast<int64_t>(writer.finish(list.classes, options, output));
  return summary;
}

struct PackedImages::Entry {
  uint64_t payload_offset = 0;
  uint32_t payload = 0, crc = 0;
  bool raw = false;
  int64_t width = 0, height = 0, channels = 0;
};

PackedImages::PackedImages(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path, fs::exists(path) ? "cannot open: " + errno_text() : "no such file");
  struct stat status {};
  if (::fstat(fd, &status) != 0 || status.st_size < static_cast<off_t>(kHeaderBytes)) {
    ::close(fd);
    throw DataError(path, "not an .abpk pack (shorter than its header page)");
  }
  map_bytes_ = static_cast<size_t>(status.st_size);
  void* mapped = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) throw DataError(path, "cannot map: " + errno_text());
  map_ = static_cast<const uint8_t*>(mapped);
  try {
    read_layout();
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    throw;
  }
}

PackedImages::~PackedImages() { ::munmap(const_cast<uint8_t*>(map_), map_bytes_); }

void PackedImages::read_layout() {
  const auto damaged = [this](const std::string& problem) { return DataError(path_, "a damaged pack: " + problem); };
  if (std::memcmp(map_, kPartialPackMagic, sizeof(kPartialPackMagic)) == 0) {
    throw DataError(path_, "an unfinished pack: run `afterburner data pack` again with the same source and options "
                           "to finish it");
  }
  if (std::memcmp(map_, kPackMagic, sizeof(kPackMagic)) != 0) {
    throw DataError(path_, "not an .abpk pack (its magic differs)");
  }
  constexpr size_t kHeaderFields = 60;
  if (get<uint32_t>(map_ + kHeaderFields) != crc_of(map_, kHeaderFields)) throw damaged("its header fails its CRC-32");
  const auto version = get<uint32_t>(map_ + 8);
  if (version != kVersion) {
    throw DataError(path_, fmt::format("pack version {}; this afterburner reads {}", version, kVersion));
  }
  const bool raw = get<uint32_t>(map_ + 12) & kRawFlag;
  const auto records = get<uint64_t>(map_ + 16), index_offset = get<uint64_t>(map_ + 24);
  const auto classes_offset = get<uint64_t>(map_ + 32), declared_bytes = get<uint64_t>(map_ + 40);
  const auto max_side = get<int32_t>(map_ + 48), quality = get<int32_t>(map_ + 52);
  if (declared_bytes != map_bytes_) {
    throw damaged(fmt::format("{} bytes where its header says {} (cut short or appended to)", map_bytes_,
                              declared_bytes));
  }
  if (index_offset < kHeaderBytes || index_offset > classes_offset || classes_offset + 4 > declared_bytes ||
      (classes_offset - index_offset) / kEntryBytes != records || (classes_offset - index_offset) % kEntryBytes != 0) {
    throw damaged("its sections do not fit in it");
  }
  uint64_t at = classes_offset;
  const auto class_count = get<uint32_t>(map_ + at);
  at += 4;
  for (uint32_t c = 0; c < class_count; ++c) {
    if (at + 4 > declared_bytes || at + 4 + get<uint32_t>(map_ + at) > declared_bytes) {
      throw damaged("its class names are cut");
    }
    const auto length = get<uint32_t>(map_ + at);
    classes_.emplace_back(reinterpret_cast<const char*>(map_ + at + 4), length);
    at += 4 + length;
  }
  if (at != declared_bytes) throw damaged("bytes after its class names");
  entries_.reserve(records);
  labels_.reserve(records);
  for (uint64_t i = 0; i < records; ++i) {
    const uint8_t* entry = map_ + index_offset + i * kEntryBytes;
    RecordHeader r = decode_fields(entry);
    r.offset = get<uint64_t>(entry);
    const bool known = r.format == Format::jpeg || r.format == Format::png || r.format == Format::raw;
    const bool sized = r.format != Format::raw ||
                       ((r.channels == 1 || r.channels == 3) && uint64_t{r.width} * r.height * r.channels == r.payload);
    if (r.offset < kHeaderBytes || r.offset + kRecordHeaderBytes + r.payload > index_offset || !known || !sized ||
        r.width == 0 || r.height == 0 || r.label < 0 || static_cast<uint32_t>(r.label) >= class_count ||
        (r.format == Format::raw) != raw) {
      throw damaged(fmt::format("index entry {} is not a record of it", i));
    }
    entries_.push_back(
        {r.offset + kRecordHeaderBytes, r.payload, r.crc, r.format == Format::raw, r.width, r.height, r.channels});
    labels_.push_back(r.label);
  }
  checked_ = std::make_unique<std::atomic<bool>[]>(records);
  storage_ = raw ? "raw" : max_side > 0 ? fmt::format("jpeg q{}", quality) : "as stored";
  if (max_side > 0) storage_ += fmt::format(", max side {}", max_side);
}

int64_t PackedImages::size() const { return static_cast<int64_t>(entries_.size()); }

torch::Tensor PackedImages::storage_blocks() const {
  torch::Tensor blocks = torch::empty({size()}, torch::kLong);
  int64_t* block = blocks.data_ptr<int64_t>();
  for (size_t i = 0; i < entries_.size(); ++i) block[i] = static_cast<int64_t>(entries_[i].payload_offset / kBlockBytes);
  return blocks;
}

bool PackedImages::larger_than_memory() const {
  // MemAvailable counts the page cache the kernel can reclaim (a pack read once sits there);
  // free pages alone would call most packs too large on a machine that has read files.
  std::ifstream meminfo("/proc/meminfo");
  uint64_t available_kb = 0;
  for (std::string key; meminfo >> key;) {
    if (key == "MemAvailable:" && meminfo >> available_kb) break;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (available_kb == 0) {
    available_kb = static_cast<uint64_t>(::sysconf(_SC_AVPHYS_PAGES)) * ::sysconf(_SC_PAGESIZE) / 1024;
  }
  return map_bytes_ > available_kb * 1024 / 2;
}

ImageRecords::Record PackedImages::record(int64_t index, std::vector<char>& /*scratch*/) const {
  const Entry& entry = entries_.at(static_cast<size_t>(index));
  const uint8_t* bytes = map_ + entry.payload_offset;
  if (!checked_[index].load(std::memory_order_relaxed)) {
    if (crc_of(bytes, entry.payload) != entry.crc) {
      throw DataError(source(index), "fails its CRC-32 check: the pack is damaged");
    }
    checked_[index].store(true, std::memory_order_relaxed);
  }
  return {bytes, entry.payload, entry.raw, entry.width, entry.height, entry.channels};
}

std::string PackedImages::source(int64_t index) const { return fmt::format("{} record {}", path_, index); }

}  // namespace afterburner::data
