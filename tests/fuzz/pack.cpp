// .abpk packs (data/pack.h): any bytes, read as a pack and every record decoded. The harness
// signs the header (its file size and CRC-32) so that mutations reach the index, the class names
// and the records behind it instead of stopping at the header's checks.
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "afterburner/data/image_records.h"
#include "afterburner/data/pack.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kSizeField = 40, kCrcField = 60;
  static const afterburner::testing::TempDir dir;
  const std::string path = dir / "input.abpk";
  std::string bytes = afterburner::fuzz::bytes(data, size);
  if (bytes.size() >= kCrcField + 4) {
    const uint64_t length = bytes.size();
    std::memcpy(&bytes[kSizeField], &length, sizeof(length));
    const auto crc = static_cast<uint32_t>(
        crc32(crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(kCrcField)));
    std::memcpy(&bytes[kCrcField], &crc, sizeof(crc));
  }
  afterburner::testing::write_file(path, bytes);
  afterburner::fuzz::expect_clean_errors([&] {
    const afterburner::data::PackedImages pack(path);
    constexpr int64_t kRecordsDecoded = 8;
    for (int64_t i = 0; i < std::min(pack.size(), kRecordsDecoded); ++i) afterburner::data::decode_record(pack, i);
  });
  return 0;
}
