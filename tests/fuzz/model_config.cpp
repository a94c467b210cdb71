// A served model's config.toml (serve/repository.h), beside an empty model.pt: reading the
// config only checks that the model file exists.
#include "afterburner/serve/repository.h"
#include "fuzz.h"

namespace {

std::filesystem::path model_directory() {
  static const afterburner::testing::TempDir repository;
  std::filesystem::create_directories(repository / "model");
  afterburner::testing::write_file(repository / "model" / "model.pt", "");
  return repository / "model";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path model = model_directory();
  afterburner::testing::write_file(model / "config.toml", afterburner::fuzz::bytes(data, size));
  afterburner::fuzz::expect_clean_errors([&] { afterburner::serve::load_model_config(model); });
  return 0;
}
