// Outputs that cannot be written, on a full device and on a full disk: one error line naming the
// file and exit 1, never an abort or a "wrote"; a regular file keeps its previous bytes and no
// temporary file is left behind. Non-regular targets are written in place, never replaced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <torch/script.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {
namespace fs = std::filesystem;

// The CLI with files limited to 512 bytes (below every output here) and SIGXFSZ ignored (an
// ignored signal stays ignored across exec), so that a write past the limit fails with EFBIG, as
// on a full disk. The captured stderr is a file under the same limit, which its one error line
// fits; stdout, which would not, is discarded.
CommandResult run_cli_on_full_disk(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"/bin/sh", "-c", "trap '' XFSZ; ulimit -f 1; exec \"$0\" \"$@\" >/dev/null",
                                cli_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

std::vector<std::string> short_train(const fs::path& data, std::map<std::string, std::string> flags) {
  flags.emplace("--max-steps", "1");
  flags.emplace("--batch-size", "32");
  flags.emplace("--model", "mlp");
  return train_args(data, flags);
}

// Arguments of a command writing `out`, given the data directory and a TorchScript mlp.
using CommandFor = std::function<std::vector<std::string>(const fs::path& data, const fs::path& out,
                                                          const fs::path& model)>;

struct OutputCase {
  std::string name;
  std::string output;  // relative to the test's directory
  CommandFor command;
  bool needs_model = false;
};

void PrintTo(const OutputCase& output, std::ostream* out) { *out << output.name; }

const std::vector<OutputCase>& output_cases() {
  static const std::vector<OutputCase> cases{
      {"export", "model.pt", [](auto& data, auto& out, auto&) { return short_train(data, {{"--export", out}}); }},
      {"report", "report.json", [](auto& data, auto& out, auto&) { return short_train(data, {{"--report", out}}); }},
      {"checkpoint", "ck/checkpoint.pt",
       [](auto& data, auto& out, auto&) {
         return short_train(data, {{"--checkpoint-dir", out.parent_path()}, {"--checkpoint-every", "1"}});
       }},
      {"trace", "trace.json",
       [](auto& data, auto& out, auto&) {
         return short_train(data, {{"--profile", "1"}, {"--trace", out}, {"--max-steps", "8"}});
       }},
      {"optimize", "optimized.pt",
       [](auto& data, auto& out, auto& model) {
         return std::vector<std::string>{"optimize", model,     "-o",     out, "--data", data, "--measure-seconds", "0",
                                         "--threads", "1"};
       },
       true},
      {"sketch", "sketched.pt",
       [](auto&, auto& out, auto& model) {
         return std::vector<std::string>{"sketch", model, "-o", out, "--rank", "16"};
       },
       true},
      {"bench_csv", "landscape.csv",
       [](auto&, auto& out, auto&) {
         return std::vector<std::string>{"bench",        "sketch", "--in",    "64",  "--out", "64",  "--reps",
                                         "1",            "--landscape", "--terms-list", "1,2", "--ranks", "1,2,4,8",
                                         "--csv", out};
       }},
      {"bench_svg", "landscape.svg",
       [](auto&, auto& out, auto&) {
         return std::vector<std::string>{"bench",        "sketch", "--in",    "64", "--out", "64", "--reps",
                                         "1",            "--landscape", "--terms-list", "1", "--ranks", "1",
                                         "--svg", out};
       }}};
  return cases;
}

std::vector<OutputCase> cases_named(const std::set<std::string>& names) {
  std::vector<OutputCase> picked;
  for (const auto& output : output_cases()) {
    if (names.count(output.name)) picked.push_back(output);
  }
  return picked;
}

class CliOutputs : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_mnist(dir_.path(), 256, 64); }

  // A one-step mlp exported by `train`: the input of optimize and sketch.
  fs::path exported_mlp() {
    const auto path = dir_ / "mlp.pt";
    auto result = run_cli(short_train(dir_.path(), {{"--export", path.string()}}));
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return path;
  }

  TempDir dir_;
};

class CliFullDisk : public CliOutputs, public ::testing::WithParamInterface<OutputCase> {};

TEST_P(CliFullDisk, KeepsThePreviousFileAndNamesIt) {
  const OutputCase& output = GetParam();
  const fs::path model = output.needs_model ? exported_mlp() : fs::path();
  const fs::path out = dir_ / output.output;
  fs::create_directories(out.parent_path());
  const std::string previous = "the previous " + output.name + "\n";
  write_file(out, previous);
  const auto before = entries(out.parent_path());

  auto result = run_cli_on_full_disk(output.command(dir_.path(), out, model));
  // An export's line also says after which step at which precision it failed.
  EXPECT_TRUE(fails_with(result, 1, {out.string() + ": cannot write: " + std::strerror(EFBIG) + "; the previous file is kept"}));
  EXPECT_EQ(read_file(out), previous);
  EXPECT_EQ(entries(out.parent_path()), before) << "a temporary file was left behind";
}

INSTANTIATE_TEST_SUITE_P(Outputs, CliFullDisk, ::testing::ValuesIn(output_cases()),
                         [](const auto& info) { return info.param.name; });

// The JSON-lines log is streamed (readers follow it as it grows), so a full disk cannot keep the
// previous log: it still ends the run with one line naming the file, and no temporary file.
TEST_F(CliOutputs, LogOnAFullDiskIsOneErrorLine) {
  const fs::path log = dir_ / "log.jsonl";
  const auto before = entries(dir_.path());
  auto result = run_cli_on_full_disk(short_train(dir_.path(), {{"--log-jsonl", log.string()}, {"--max-steps", "8"}}));
  EXPECT_TRUE(fails_with(result, 1, {"afterburner: " + log.string() + ": cannot write: " + std::strerror(EFBIG)}));
  auto after = entries(dir_.path());
  after.erase(log.filename().string());
  EXPECT_EQ(after, before) << "a temporary file was left behind";
}

// A device node with /dev/full's numbers, in the test's directory: a regression that replaced its
// target would replace this node, never the system's /dev/full.
class CliFullDevice : public CliFullDisk {};

TEST_P(CliFullDevice, IsOneErrorLineAndStaysADevice) {
  const OutputCase& output = GetParam();
  const fs::path model = output.needs_model ? exported_mlp() : fs::path();
  const fs::path device = dir_ / "full";
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) {
    GTEST_SKIP() << "cannot make a device node here (needs root and a file system without nodev)";
  }
  const auto before = entries(dir_.path());

  auto result = run_cli(output.command(dir_.path(), device, model));
  EXPECT_TRUE(fails_with(result, 1, {device.string() + ": cannot write: " + std::strerror(ENOSPC)}));
  EXPECT_FALSE(Contains(result.out, "wrote"));
  struct stat status {};
  ASSERT_EQ(::stat(device.c_str(), &status), 0);
  EXPECT_TRUE(S_ISCHR(status.st_mode)) << "the device was replaced";
  EXPECT_EQ(entries(dir_.path()), before) << "a file was left behind";
}

INSTANTIATE_TEST_SUITE_P(Outputs, CliFullDevice,
                         ::testing::ValuesIn(cases_named({"export", "optimize", "sketch"})),
                         [](const auto& info) { return info.param.name; });

// A FIFO, like /dev/stdout in a pipeline, is written in place: its reader gets the whole model.
TEST_F(CliOutputs, SketchIntoAFifoWritesInPlaceAndSaysSoAfterwards) {
  const auto model = exported_mlp();
  const auto fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // The test holds a write end of its own until the CLI has exited, so that the reader ends
  // even if the CLI never opens the FIFO.
  const int read_end = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  const int held_write_end = ::open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(read_end, 0);
  ASSERT_GE(held_write_end, 0);
  ::fcntl(read_end, F_SETFL, 0);
  std::string received;
  std::thread reader([&] {
    char chunk[1 << 16];
    for (ssize_t n; (n = ::read(read_end, chunk, sizeof chunk)) > 0;) received.append(chunk, n);
  });
  auto result = run_cli({"sketch", model.string(), "-o", fifo.string(), "--rank", "16"});
  ::close(held_write_end);
  reader.join();
  ::close(read_end);

  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(Contains(result.out, "wrote " + fifo.string() + "\n"));
  EXPECT_TRUE(fs::is_fifo(fifo));
  std::istringstream bytes(received);
  auto sketched = torch::jit::load(bytes);
  EXPECT_TRUE(sketched.attr("layer1").toModule().hasattr("S1s"));
}

}  // namespace
}  // namespace afterburner::testing
