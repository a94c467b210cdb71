// A label outside the model's 10 classes (one corrupt byte in a labels file) stops `train` when
// the data is loaded: one line naming the file, the index and the value, exit 1, and no
// training (no report, nothing on stdout), with the fused ops or LibTorch's own alike.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {
namespace fs = std::filesystem;

class CliLabelRange : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { set_ = write_synthetic_mnist(dir_.path(), 100, 50); }

  CommandResult train() {
    std::map<std::string, std::string> flags{
        {"--max-steps", "1"}, {"--batch-size", "32"}, {"--report", report_.string()}};
    if (!GetParam()) flags["--no-fuse"] = "";
    return run_cli(train_args(dir_.path(), flags));
  }

  void expect_refused(const CommandResult& result, const fs::path& labels, const std::string& problem) {
    EXPECT_TRUE(fails_with(result, 1, {"afterburner: " + labels.string() + ": " + problem}));
    EXPECT_EQ(result.out, "") << "training ran";
    EXPECT_FALSE(fs::exists(report_)) << "training ran";
  }

  TempDir dir_;
  SyntheticMnist set_;
  fs::path report_ = dir_ / "report.json";
};

TEST_P(CliLabelRange, TestLabelOutsideTheClassesIsNamedBeforeTraining) {
  set_.test.labels[17] = 200;
  const auto labels = dir_ / "t10k-labels-idx1-ubyte.gz";
  write_gzip_file(labels, label_file_bytes(set_.test));
  expect_refused(train(), labels, "label 200 at index 17 is outside the model's 10 classes");
}

TEST_P(CliLabelRange, TrainLabelOneAboveTheClassesIsNamedBeforeTraining) {
  set_.train.labels[3] = 10;
  const auto labels = dir_ / "train-labels-idx1-ubyte";
  write_file(labels, label_file_bytes(set_.train));
  expect_refused(train(), labels, "label 10 at index 3 is outside the model's 10 classes");
}

INSTANTIATE_TEST_SUITE_P(FusedAndNot, CliLabelRange, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Fused" : "NoFuse"; });

}  // namespace
}  // namespace afterburner::testing
