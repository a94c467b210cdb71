// TOML training configs (train/config.h), read over the defaults and validated.
#include "afterburner/train/config.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const afterburner::testing::TempDir dir;
  const std::string path = dir / "run.toml";
  afterburner::testing::write_file(path, afterburner::fuzz::bytes(data, size));
  afterburner::fuzz::expect_clean_errors([&] {
    afterburner::train::TrainConfig config;
    afterburner::train::apply_toml_file(config, path);
    afterburner::train::validate(config);
  });
  return 0;
}
