// JPEG and PNG decoding (data/image_file.h): any bytes at all, through libjpeg-turbo and libspng.
#include "afterburner/data/image_file.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  afterburner::fuzz::expect_clean_errors([&] { afterburner::data::decode_image(data, size, "input"); });
  return 0;
}
