#include "cli_helpers.h"

#include <fcntl.h>
#include <unistd.h>

#include <torch/script.h>
#include <zlib.h>

#include <cctype>
#include <random>
#include <sstream>
#include <stdexcept>

namespace afterburner::testing {

std::string idx_bytes(uint8_t type_code, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string bytes{'\0', '\0', static_cast<char>(type_code), static_cast<char>(dims.size())};
  for (uint32_t dim : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>((dim >> shift) & 0xFF));
  }
  return bytes + data;
}

void write_gzip_file(const std::filesystem::path& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  if (!file) throw std::runtime_error("cannot create " + path.string());
  int written = gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  if (gzclose(file) != Z_OK || written != static_cast<int>(bytes.size())) {
    throw std::runtime_error("cannot write " + path.string());
  }
}

ImageSet synthetic_images(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> background(0, 60), foreground(170, 255);
  auto images = torch::empty({count, 28, 28}, torch::kByte);
  auto labels = torch::empty({count}, torch::kByte);
  auto pixels = images.accessor<uint8_t, 3>();
  for (int64_t i = 0; i < count; ++i) {
    const int label = static_cast<int>(i % 10);
    labels[i] = label;
    // Ten non-overlapping 6x5 blocks: two rows of five.
    const int top = 4 + (label / 5) * 12, left = 1 + (label % 5) * 5;
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) {
        bool inside = y >= top && y < top + 6 && x >= left && x < left + 5;
        pixels[i][y][x] = static_cast<uint8_t>(inside ? foreground(rng) : background(rng));
      }
    }
  }
  return {images, labels};
}

static std::string tensor_bytes(const torch::Tensor& t) {
  auto contiguous = t.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.nbytes());
}

std::string image_file_bytes(const ImageSet& set) {
  return idx_bytes(kIdxUint8, {static_cast<uint32_t>(set.images.size(0)), 28, 28}, tensor_bytes(set.images));
}

std::string label_file_bytes(const ImageSet& set) {
  return idx_bytes(kIdxUint8, {static_cast<uint32_t>(set.labels.size(0))}, tensor_bytes(set.labels));
}

SyntheticMnist write_synthetic_mnist(const std::filesystem::path& dir, int64_t train_count, int64_t test_count) {
  SyntheticMnist set{synthetic_images(train_count, 1), synthetic_images(test_count, 2)};
  write_file(dir / "train-images-idx3-ubyte", image_file_bytes(set.train));
  write_file(dir / "train-labels-idx1-ubyte", label_file_bytes(set.train));
  write_gzip_file(dir / "t10k-images-idx3-ubyte.gz", image_file_bytes(set.test));
  write_gzip_file(dir / "t10k-labels-idx1-ubyte.gz", label_file_bytes(set.test));
  return set;
}

std::vector<std::string> error_lines(const std::string& err) {
  std::vector<std::string> lines;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.rfind("afterburner: warning:", 0) != 0) lines.push_back(line);
  }
  return lines;
}

::testing::AssertionResult fails_with(const CommandResult& result, int exit_code,
                                      const std::vector<std::string>& needles) {
  auto lines = error_lines(result.err);
  auto failure = [&](const std::string& what) {
    return ::testing::AssertionFailure() << what << "; exit code " << result.exit_code << ", stderr:\n"
                                         << result.err;
  };
  if (result.exit_code != exit_code) return failure("expected exit code " + std::to_string(exit_code));
  if (lines.size() != 1) return failure("expected exactly one error line");
  if (lines[0].rfind("afterburner: ", 0) != 0) return failure("the error line lacks the 'afterburner: ' prefix");
  for (const auto& needle : needles) {
    if (lines[0].find(needle) == std::string::npos) return failure("the error line does not mention '" + needle + "'");
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::string> train_args(const std::filesystem::path& data_dir,
                                    const std::map<std::string, std::string>& flags) {
  std::map<std::string, std::string> all{{"--data", data_dir.string()}, {"--epochs", "1"},
                                         {"--threads", "1"},           {"--workers", "0"},
                                         {"--progress", "none"},       {"--eval-batch-size", "2000"},
                                         {"--precision", "fp32"}};
  for (const auto& [flag, value] : flags) all[flag] = value;
  std::vector<std::string> args{"train"};
  for (const auto& [flag, value] : all) {
    args.push_back(flag);
    if (!value.empty()) args.push_back(value);
  }
  return args;
}

std::string test_name(const std::string& text) {
  std::string name;
  for (char c : text) {
    bool keep = std::isalnum(static_cast<unsigned char>(c));
    if (keep) name.push_back(c);
    else if (!name.empty() && name.back() != '_') name.push_back('_');
  }
  return name;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(read_file(path));
}

void write_io_fixture(const std::filesystem::path& path, const torch::Tensor& input, const torch::Tensor& output) {
  torch::jit::Module io("Fixture");
  io.register_buffer("input", input);
  io.register_buffer("output", output);
  io.save(path.string());
}

CommandResult python_check(const std::filesystem::path& model, const std::filesystem::path& io) {
  return run({"/usr/bin/python3", (source_dir() / "bench" / "export_reference.py").string(), "--check",
              model.string(), io.string()});
}

pid_t spawn_cli(const std::vector<std::string>& args, const std::filesystem::path& stderr_file,
                const std::filesystem::path& stdout_file) {
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  std::vector<std::string> argv{cli_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> pointers;
  for (auto& a : argv) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  const std::string err_path = stderr_file.string(), out_path = stdout_file.string();
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execv(pointers[0], pointers.data());
    _exit(127);
  }
  return pid;
}

}  // namespace afterburner::testing
