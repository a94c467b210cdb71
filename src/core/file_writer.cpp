#include "afterburner/core/file_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/jit/serialization/export.h>
#include <torch/serialize/output-archive.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace afterburner {
namespace {
namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

// A symlink is followed, so that the file it points to is replaced and the link stays a link.
std::string resolved(const std::string& path) {
  std::error_code error;
  if (!fs::is_symlink(path, error)) return path;
  auto target = fs::weakly_canonical(path, error);
  return error ? path : target.string();
}

// "<dir>/.<name>.tmp-<pid>-<n>": hidden, next to the target (a rename never crosses file
// systems), unique per writer in this process.
std::string temporary_name(const std::string& target) {
  static std::atomic<unsigned> counter{0};
  fs::path path(target);
  return (path.parent_path() /
          ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
      .string();
}

void sync_directory(const std::string& file) {
  auto dir = fs::path(file).parent_path();
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // makes the rename durable; best effort on file systems that refuse it
  ::close(fd);
}

}  // namespace

FileWriter::FileWriter(std::string path, Mode mode) : path_(std::move(path)) {
  struct stat status {};
  const bool exists = ::stat(path_.c_str(), &status) == 0;
  if (exists && S_ISDIR(status.st_mode)) throw failure("it is a directory");
  const bool regular_or_new = !exists || S_ISREG(status.st_mode);
  if (!regular_or_new || mode == Mode::stream) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | (regular_or_new ? O_CREAT | O_TRUNC : 0), 0666);
    if (fd_ < 0) throw failure(errno_text());
    return;
  }
  replaces_file_ = exists;
  target_ = resolved(path_);
  for (int attempt = 1; fd_ < 0; ++attempt) {  // EEXIST: a temporary file left by a crashed process
    temporary_ = temporary_name(target_);
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt == 10)) throw failure(errno_text());
  }
  if (replaces_file_) ::fchmod(fd_, status.st_mode & 07777);  // the replacement keeps the file's mode
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temporary_.empty()) ::unlink(temporary_.c_str());
}

void FileWriter::write_all(const void* data, std::size_t size) {
  const char* bytes = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < size && error_.empty()) {
    ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = n < 0 ? errno_text() : "short write";
    } else {
      done += static_cast<std::size_t>(n);
    }
  }
}

void FileWriter::write(std::string_view bytes) {
  write_all(bytes.data(), bytes.size());
  if (!error_.empty()) throw failure(error_);
}

ByteSink FileWriter::sink() {
  return [this](const void* data, std::size_t size) {
    write_all(data, size);
    return size;
  };
}

void FileWriter::commit() {
  if (!error_.empty()) throw failure(error_);
  if (!temporary_.empty() && ::fsync(fd_) != 0) throw failure(errno_text());
  if (::close(std::exchange(fd_, -1)) != 0) throw failure(errno_text());
  if (!temporary_.empty()) {
    if (::rename(temporary_.c_str(), target_.c_str()) != 0) throw failure(errno_text());
    sync_directory(target_);
  }
  committed_ = true;
}

FileWriteError FileWriter::failure(const std::string& reason) const {
  return FileWriteError(path_, "cannot write: " + reason + (replaces_file_ ? "; the previous file is kept" : ""));
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  FileWriter file(path);
  file.write(bytes);
  file.commit();
}

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce) {
  FileWriter file(path);
  produce(file.sink());
  file.commit();
}

void write_file_atomically(const std::string& path, const torch::jit::Module& module,
                           const std::unordered_map<std::string, std::string>& extra_files) {
  write_file_atomically(path, [&](const ByteSink& sink) { torch::jit::ExportModule(module, sink, extra_files); });
}

void write_file_atomically(const std::string& path, torch::serialize::OutputArchive& archive) {
  write_file_atomically(path, [&](const ByteSink& sink) { archive.save_to(sink); });
}

void check_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  const auto directory = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(directory)) throw Error(path + " (" + flag + "): its directory does not exist");
  if (::access(directory.c_str(), W_OK) != 0) throw Error(path + " (" + flag + "): its directory is not writable");
}

}  // namespace afterburner
