#include "afterburner/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <torch/serialize.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "afterburner/core/error.h"

namespace afterburner::train {
namespace {

const char* const kFormat = "afterburner-checkpoint-1";

std::string errno_text() { return std::strerror(errno); }

// A file descriptor that is closed (and the file unlinked unless committed) on every path.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  void close_and_commit(const std::string& final_path) {
    if (::fsync(fd_) != 0) throw CheckpointError(final_path, "cannot sync: " + errno_text());
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw CheckpointError(final_path, "cannot close: " + errno_text());
    if (::rename(path_.c_str(), final_path.c_str()) != 0) {
      throw CheckpointError(final_path, "cannot rename the temporary file into place: " + errno_text());
    }
    committed_ = true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

void sync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // makes the rename durable; best effort on filesystems that refuse it
  ::close(fd);
}

void write_archive(const std::string& path, torch::serialize::OutputArchive& archive) {
  std::filesystem::path final_path(path);
  TempFile tmp(path + ".tmp." + std::to_string(::getpid()));
  if (tmp.fd() < 0) throw CheckpointError(path, "cannot create a temporary file: " + errno_text());
  std::string write_error;
  // LibTorch's zip writer terminates the process when its sink reports a short write (it
  // throws from a destructor), so the sink always claims success and remembers the failure.
  archive.save_to([&](const void* data, size_t size) -> size_t {
    const char* bytes = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size && write_error.empty()) {
      ssize_t n = ::write(tmp.fd(), bytes + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) write_error = n < 0 ? errno_text() : "short write";
      else done += static_cast<size_t>(n);
    }
    return size;
  });
  if (!write_error.empty()) {
    throw CheckpointError(path, "write failed (" + write_error + "); the previous checkpoint is kept");
  }
  tmp.close_and_commit(path);
  sync_directory(final_path.parent_path());
}

std::string first_line(const c10::Error& e) {
  std::string text = e.what_without_backtrace();
  return text.substr(0, text.find('\n'));
}

std::vector<std::vector<int64_t>> parameter_shapes(const torch::nn::Module& model) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : model.parameters()) shapes.push_back(p.sizes().vec());
  for (const auto& b : model.buffers()) shapes.push_back(b.sizes().vec());
  return shapes;
}

torch::Tensor scalar(int64_t v) { return torch::tensor(v, torch::kLong); }
torch::Tensor scalar(double v) { return torch::tensor(v, torch::kDouble); }

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointTarget& target) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kFormat)));
  archive.write("model_name", c10::IValue(target.model_name));
  torch::serialize::OutputArchive model, optimizer;
  target.model.save(model);
  target.optimizer.save(optimizer);
  archive.write("model", model);
  archive.write("optimizer", optimizer);
  target.scaler.save(archive);
  archive.write("state.epoch", scalar(target.state.epoch));
  archive.write("state.step", scalar(target.state.step));
  archive.write("state.batch_in_epoch", scalar(target.state.batch_in_epoch));
  archive.write("state.train_seconds", scalar(target.state.train_seconds));
  archive.write("state.seconds_to_target", scalar(target.state.seconds_to_target));
  archive.write("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  write_archive(path, archive);
}

TrainState load_checkpoint(const std::string& path, CheckpointTarget target) {
  if (!std::filesystem::exists(path)) throw CheckpointError(path, "no such checkpoint");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    throw CheckpointError(path, "not a readable checkpoint (corrupt or truncated file)");
  }
  c10::IValue format, model_name;
  if (!archive.try_read("format", format) || !format.isString() || format.toStringRef() != kFormat) {
    throw CheckpointError(path, "not an afterburner checkpoint");
  }
  if (!archive.try_read("model_name", model_name) || model_name.toStringRef() != target.model_name) {
    throw CheckpointError(path, "holds model '" + (model_name.isString() ? model_name.toStringRef() : "?") +
                                    "', but this run trains '" + target.model_name + "'");
  }
  TrainState state;
  bool shapes_differ = false;
  try {
    torch::serialize::InputArchive model, optimizer;
    archive.read("model", model);
    archive.read("optimizer", optimizer);
    auto shapes = parameter_shapes(target.model);
    target.model.load(model);
    shapes_differ = parameter_shapes(target.model) != shapes;
    target.optimizer.load(optimizer);
    target.scaler.load(archive);
    torch::Tensor epoch, step, batch, seconds, to_target, rng;
    archive.read("state.epoch", epoch);
    archive.read("state.step", step);
    archive.read("state.batch_in_epoch", batch);
    archive.read("state.train_seconds", seconds);
    archive.read("state.seconds_to_target", to_target);
    archive.read("rng.cpu", rng);
    auto generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
    state = {epoch.item<int64_t>(), step.item<int64_t>(), batch.item<int64_t>(), seconds.item<double>(),
             to_target.item<double>()};
  } catch (const c10::Error& e) {
    throw CheckpointError(path, "does not fit this run: " + first_line(e));
  } catch (const Error& e) {  // e.g. an optimizer state that does not fit the parameters
    throw CheckpointError(path, std::string("does not fit this run: ") + e.what());
  }
  if (shapes_differ) {
    throw CheckpointError(path, "its tensors have other shapes than this run's model '" + target.model_name + "'");
  }
  return state;
}

}  // namespace afterburner::train
