// IDX files, raw or gzip-compressed (data/idx.h): any bytes at all.
#include "afterburner/data/idx.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const afterburner::testing::TempDir dir;
  const std::string path = dir / "input-idx3-ubyte";
  afterburner::testing::write_file(path, afterburner::fuzz::bytes(data, size));
  afterburner::fuzz::expect_clean_errors([&] { afterburner::data::read_idx(path); });
  return 0;
}
