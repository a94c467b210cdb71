// NumPy .npy files (data/npy.h): any bytes at all.
#include "afterburner/data/npy.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const afterburner::testing::TempDir dir;
  const std::string path = dir / "input.npy";
  afterburner::testing::write_file(path, afterburner::fuzz::bytes(data, size));
  afterburner::fuzz::expect_clean_errors([&] { afterburner::data::read_npy(path); });
  return 0;
}
