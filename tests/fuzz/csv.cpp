// CSV datasets (data/csv.h). The first byte picks the options, the rest is the file:
// bit 0 header, bits 1-2 the delimiter (, \t ; space), bit 3 the label by the name "label",
// bits 4-5 the label column (-1, 0, 1, -2); bit 6 reads it as `afterburner train` does instead
// (load_csv_table: delimiter and header detected, the label column named "label" by bit 3).
#include <array>

#include "afterburner/data/csv.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const afterburner::testing::TempDir dir;
  const std::string path = dir / "input.csv";
  afterburner::testing::write_file(path, afterburner::fuzz::bytes(data + 1, size - 1));
  const uint8_t bits = data[0];
  auto options = afterburner::data::CsvOptions()
                     .header(bits & 1)
                     .delimiter(",\t; "[(bits >> 1) & 3])
                     .label_name(bits & 8 ? "label" : "")
                     .label_column(std::array<int64_t, 4>{-1, 0, 1, -2}[(bits >> 4) & 3]);
  if (bits & 64) {
    afterburner::fuzz::expect_clean_errors([&] { afterburner::data::load_csv_table(path, bits & 8 ? "label" : ""); });
  } else {
    afterburner::fuzz::expect_clean_errors([&] { afterburner::data::read_csv(path, options); });
  }
  return 0;
}
