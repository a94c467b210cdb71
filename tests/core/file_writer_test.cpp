// FileWriter: all or nothing on regular files, in place (never replaced) on devices,
// and every failure one FileWriteError naming the file.
#include "afterburner/core/file_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>

#include "testing.h"

namespace afterburner {
namespace {
namespace fs = std::filesystem;
using testing::error_message;
using testing::read_file;
using testing::TempDir;

// Files above `bytes` cannot grow, as on a full disk: with SIGXFSZ ignored, write() fails with
// EFBIG instead of the signal killing the process. Restored on destruction.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) : old_handler_(std::signal(SIGXFSZ, SIG_IGN)) {
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit limited = old_;
    limited.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limited);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  void (*old_handler_)(int);
};

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A TorchScript module of `weights` floats, as users script them.
torch::jit::Module scripted_module(int64_t weights) {
  torch::jit::Module module("Scaled");
  module.register_parameter("weight", torch::randn({weights}), /*is_buffer=*/false);
  module.define("def forward(self, x):\n    return x * self.weight\n");
  return module;
}

TEST(FileWriter, WritesANewFileAndLeavesNoTemporary) {
  TempDir dir;
  write_file_atomically((dir / "out.txt").string(), "new bytes\n");
  EXPECT_EQ(read_file(dir / "out.txt"), "new bytes\n");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"out.txt"});
}

TEST(FileWriter, ReplacesAFileKeepingItsMode) {
  TempDir dir;
  testing::write_file(dir / "out.txt", "old");
  fs::permissions(dir / "out.txt", fs::perms::owner_read | fs::perms::owner_write);
  write_file_atomically((dir / "out.txt").string(), "new");
  EXPECT_EQ(read_file(dir / "out.txt"), "new");
  EXPECT_EQ(fs::status(dir / "out.txt").permissions(), fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"out.txt"});
}

TEST(FileWriter, UncommittedWriteLeavesTheTargetUntouched) {
  TempDir dir;
  testing::write_file(dir / "report.json", "previous run\n");
  {
    FileWriter report((dir / "report.json").string());
    report.write("this run, unfinished\n");
  }
  EXPECT_EQ(read_file(dir / "report.json"), "previous run\n");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"report.json"});
}

TEST(FileWriter, StreamShowsEachWriteAtOnceAndKeepsItWithoutCommit) {
  TempDir dir;
  const auto path = dir / "log.jsonl";
  testing::write_file(path, "previous run\n");
  {
    FileWriter log(path.string(), FileWriter::Mode::stream);
    log.write("line 1\n");
    EXPECT_EQ(read_file(path), "line 1\n");
    log.write("line 2\n");
  }
  EXPECT_EQ(read_file(path), "line 1\nline 2\n");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"log.jsonl"});
}

TEST(FileWriter, StreamOnAFullDiskNamesTheFile) {
  TempDir dir;
  const auto path = (dir / "log.jsonl").string();
  FileWriter log(path, FileWriter::Mode::stream);
  std::string message;
  {
    FileSizeLimit limit(1 << 10);
    message = error_message<FileWriteError>([&] { log.write(std::string(4 << 10, 'x')); });
  }
  EXPECT_EQ(message, path + ": cannot write: " + std::strerror(EFBIG));
}

// A full disk part way through: bytes written directly, and a module through LibTorch's zip
// writer, which would terminate the process if its sink reported the short write.
TEST(FileWriter, FullDiskKeepsThePreviousFileAndLeavesNoTemporary) {
  TempDir dir;
  const auto path = (dir / "out.bin").string();
  const std::string previous = "previous bytes";
  testing::write_file(path, previous);
  const std::vector<std::function<void()>> writes{
      [&] { write_file_atomically(path, std::string(256 << 10, 'x')); },
      [&] { write_file_atomically(path, scripted_module(64 << 10)); }};
  for (const auto& write : writes) {
    std::string message;
    {
      FileSizeLimit limit(64 << 10);
      message = error_message<FileWriteError>(write);
    }
    EXPECT_EQ(message, path + ": cannot write: " + std::strerror(EFBIG) + "; the previous file is kept");
    EXPECT_EQ(read_file(path), previous);
    EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"out.bin"});
  }
}

// A device node of /dev/full's own numbers, made here so that a writer that replaced its target
// would replace this node, never the system's /dev/full.
TEST(FileWriter, FullDeviceIsWrittenInPlaceAndNeverReplaced) {
  TempDir dir;
  const auto device = dir / "full";
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) {
    GTEST_SKIP() << "cannot make a device node here (needs root and a file system without nodev)";
  }
  for (const auto& write : std::vector<std::function<void()>>{
           [&] { write_file_atomically(device.string(), "bytes"); },
           [&] { write_file_atomically(device.string(), scripted_module(16)); }}) {
    EXPECT_EQ(error_message<FileWriteError>(write), device.string() + ": cannot write: " + std::strerror(ENOSPC));
    struct stat status {};
    ASSERT_EQ(::stat(device.c_str(), &status), 0);
    EXPECT_TRUE(S_ISCHR(status.st_mode)) << "the device was replaced";
    EXPECT_EQ(status.st_rdev, makedev(1, 7));
    EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"full"});
  }
}

TEST(FileWriter, SymlinkedFileIsReplacedBehindTheLink) {
  TempDir dir;
  fs::create_directory(dir / "real");
  testing::write_file(dir / "real" / "model.pt", "old");
  fs::create_symlink(dir / "real" / "model.pt", dir / "link.pt");
  write_file_atomically((dir / "link.pt").string(), "new");
  EXPECT_TRUE(fs::is_symlink(dir / "link.pt"));
  EXPECT_EQ(read_file(dir / "real" / "model.pt"), "new");
  EXPECT_EQ(entries(dir / "real"), std::vector<std::string>{"model.pt"});
}

TEST(FileWriter, DirectoryAndMissingDirectoryAreNamed) {
  TempDir dir;
  EXPECT_EQ(error_message<FileWriteError>([&] { write_file_atomically(dir.path().string(), "x"); }),
            dir.path().string() + ": cannot write: it is a directory");
  const auto missing = (dir / "no-such-dir" / "out.json").string();
  EXPECT_EQ(error_message<FileWriteError>([&] { write_file_atomically(missing, "x"); }),
            missing + ": cannot write: " + std::strerror(ENOENT));
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(FileWriter, ModuleAndArchiveRoundTrip) {
  TempDir dir;
  auto module = scripted_module(5);
  write_file_atomically((dir / "module.pt").string(), module);
  auto loaded = torch::jit::load((dir / "module.pt").string());
  const auto input = torch::randn({5});
  EXPECT_TRUE(torch::equal(loaded.forward({input}).toTensor(), module.forward({input}).toTensor()));

  torch::serialize::OutputArchive archive;
  const auto tensor = torch::randn({3, 4});
  archive.write("tensor", tensor);
  write_file_atomically((dir / "archive.pt").string(), archive);
  torch::serialize::InputArchive read_back;
  read_back.load_from((dir / "archive.pt").string());
  torch::Tensor restored;
  read_back.read("tensor", restored);
  EXPECT_TRUE(torch::equal(restored, tensor));
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"archive.pt", "module.pt"}));
}

}  // namespace
}  // namespace afterburner
