// Bad dataset files: each exits 1 with one line naming the file at fault.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {
namespace fs = std::filesystem;

class CliDataErrors : public ::testing::Test {
 protected:
  void SetUp() override { set_ = write_synthetic_mnist(dir_.path(), 100, 50); }

  CommandResult train() {
    return run_cli(train_args(dir_.path(), {{"--max-steps", "1"}, {"--batch-size", "32"}}));
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  TempDir dir_;
  SyntheticMnist set_;
};

TEST_F(CliDataErrors, SyntheticSetTrains) {
  auto result = train();
  EXPECT_EQ(result.exit_code, 0) << result.err;
}

TEST_F(CliDataErrors, MissingDataDirIsNamedAndSoIsTheFileLookedFor) {
  auto missing = dir_ / "no-such-dir";
  EXPECT_TRUE(fails_with(run_cli(train_args(missing, {{"--max-steps", "1"}})), 1,
                         {missing.string() + ": no such file or folder"}));
  EXPECT_TRUE(fails_with(run_cli(train_args(missing, {{"--max-steps", "1"}, {"--data-format", "idx"}})), 1,
                         {(missing / "train-images-idx3-ubyte").string()}));
}

TEST_F(CliDataErrors, MissingLabelFileIsNamed) {
  fs::remove(dir_ / "train-labels-idx1-ubyte");
  EXPECT_TRUE(fails_with(train(), 1, {file("train-labels-idx1-ubyte")}));
}

TEST_F(CliDataErrors, BadMagicIsNamed) {
  std::string bytes = image_file_bytes(set_.train);
  bytes[0] = 0x12;
  bytes[1] = 0x34;
  write_file(dir_ / "train-images-idx3-ubyte", bytes);
  EXPECT_TRUE(fails_with(train(), 1, {file("train-images-idx3-ubyte"), "magic"}));
}

TEST_F(CliDataErrors, TruncatedImageFileIsNamed) {
  std::string bytes = image_file_bytes(set_.train);
  write_file(dir_ / "train-images-idx3-ubyte", bytes.substr(0, bytes.size() / 2));
  EXPECT_TRUE(fails_with(train(), 1, {file("train-images-idx3-ubyte"), "truncated"}));
}

TEST_F(CliDataErrors, TruncatedGzipImageFileIsNamed) {
  auto path = dir_ / "t10k-images-idx3-ubyte.gz";
  std::string gz = read_file(path);
  write_file(path, gz.substr(0, gz.size() / 2));
  EXPECT_TRUE(fails_with(train(), 1, {path.string()}));
}

TEST_F(CliDataErrors, TrailingBytesAreNamed) {
  write_file(dir_ / "train-labels-idx1-ubyte", label_file_bytes(set_.train) + "extra");
  EXPECT_TRUE(fails_with(train(), 1, {file("train-labels-idx1-ubyte")}));
}

TEST_F(CliDataErrors, ImageLabelCountMismatchNamesBothFilesAndCounts) {
  ImageSet fewer{set_.train.images, set_.train.labels.slice(0, 0, 90)};
  write_file(dir_ / "train-labels-idx1-ubyte", label_file_bytes(fewer));
  EXPECT_TRUE(fails_with(train(), 1, {file("train-labels-idx1-ubyte"), file("train-images-idx3-ubyte"), "90", "100"}));
}

TEST_F(CliDataErrors, ImagesOfAnotherSizeAreNamed) {
  std::string black_pixels(50 * 32 * 32, '\0');
  write_gzip_file(dir_ / "t10k-images-idx3-ubyte.gz", idx_bytes(kIdxUint8, {50, 32, 32}, black_pixels));
  EXPECT_TRUE(fails_with(train(), 1, {file("t10k-images-idx3-ubyte.gz"), "28"}));
}

}  // namespace
}  // namespace afterburner::testing
