// core/archive.h: one record of a TorchScript archive read and checked without the others.
#include "afterburner/core/archive.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <string>

#include "afterburner/core/file_writer.h"
#include "testing.h"

namespace afterburner {
namespace {

std::string saved_module(const testing::TempDir& dir, const std::unordered_map<std::string, std::string>& extra) {
  torch::jit::Module module("Identity");
  module.define("def forward(self, x):\n  return x\n");
  const std::string path = dir / "model.pt";
  write_file_atomically(path, module, extra);
  return path;
}

TEST(ReadArchiveRecord, ReadsTheExtraFileTorchScriptWritesAndNothingWhenAbsent) {
  const testing::TempDir dir;
  const std::string metadata = R"({"classes": ["cat", "dog"]})";
  const std::string path = saved_module(dir, {{"afterburner.json", metadata}});
  EXPECT_EQ(read_archive_record(path, "/extra/afterburner.json"), metadata);
  EXPECT_EQ(read_archive_record(path, "/extra/afterburner.json"), metadata);  // a second call
  torch::jit::ExtraFilesMap extra{{"afterburner.json", ""}};
  torch::jit::load(path, torch::kCPU, extra);  // what LibTorch itself reads back
  EXPECT_EQ(extra["afterburner.json"], metadata);
  EXPECT_FALSE(read_archive_record(saved_module(dir, {}), "/extra/afterburner.json").has_value());
}

TEST(ReadArchiveRecord, AFlippedByteInTheRecordFailsItsCrc) {
  const testing::TempDir dir;
  const std::string metadata = "afterburner metadata, stored uncompressed";
  const std::string path = saved_module(dir, {{"afterburner.json", metadata}});
  std::string bytes = testing::read_file(path);
  const size_t at = bytes.find(metadata);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] ^= 1;
  testing::write_file(path, bytes);
  try {
    read_archive_record(path, "/extra/afterburner.json");
    FAIL() << "a damaged record was read";
  } catch (const ArchiveError& e) {
    EXPECT_NE(std::string(e.what()).find("fails its CRC-32 check"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_archive_record(dir / "missing.pt", "x"), ArchiveError);
}

}  // namespace
}  // namespace afterburner
