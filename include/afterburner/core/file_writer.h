// Every file afterburner writes (models, checkpoints, reports, logs, traces, benchmark tables)
// goes through FileWriter, so that a full disk or a missing directory is one FileWriteError
// naming the file, and never a torn file or a lost previous one:
//  - a regular file, or a new path, is written to a temporary file in the same directory, synced
//    and renamed over the target (a symlink's target): the target holds either its previous
//    bytes or all the new ones;
//  - an existing target that is not a regular file (/dev/stdout, /dev/full, a FIFO) is written in
//    place, every write checked. It is never replaced: as root, renaming a file over /dev/full
//    would replace the device node.
//
//   write_file_atomically("run.json", report.dump(2));
//   write_file_atomically("cnn.pt", module);                  // a torch::jit::Module, as module.save
//   write_file_atomically("ckpt.pt", archive);                // a torch::serialize::OutputArchive
//   FileWriter report("run.json");
//   report.write(text);                                       // throws FileWriteError on a short write
//   report.commit();                                          // without it, the target is untouched
//   FileWriter log("run.jsonl", FileWriter::Mode::stream);    // a log: lines reach the file as written
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "afterburner/core/error.h"

namespace torch::jit {
struct Module;
}  // namespace torch::jit
namespace torch::serialize {
class OutputArchive;
}  // namespace torch::serialize

namespace afterburner {

// A file that cannot be written; what() is "<file>: cannot write: <reason>".
class FileWriteError : public Error {
 public:
  FileWriteError(const std::string& file, const std::string& problem)
      : Error(file + ": " + problem), problem_(problem) {}
  const std::string& problem() const { return problem_; }

 private:
  std::string problem_;
};

// LibTorch's serializers write through a function like this, returning the bytes taken.
using ByteSink = std::function<std::size_t(const void* data, std::size_t size)>;

class FileWriter {
 public:
  enum class Mode {
    replace,  // all or nothing: a temporary file renamed over the target by commit()
    stream,   // a log that readers follow while it grows (tail -f) and a killed run keeps: the
              // target is truncated and written in place, every write checked
  };

  // Opens the temporary file (or the target, in place). Throws FileWriteError naming `path`.
  explicit FileWriter(std::string path, Mode mode = Mode::replace);
  // Without commit(): the temporary file is removed and the target keeps its previous bytes.
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  // Writes all of `bytes` or throws FileWriteError.
  void write(std::string_view bytes);
  // For serializers that must not see a failure (LibTorch's zip writer terminates the process
  // when its sink reports a short write): the sink always reports success and remembers the
  // first failure, which commit() then throws. The sink must not outlive this writer.
  ByteSink sink();
  // Syncs, closes and renames the temporary file over the target (or closes the non-regular
  // target), checking each step. Throws FileWriteError; the target is then untouched.
  void commit();

  const std::string& path() const { return path_; }

 private:
  void write_all(const void* data, std::size_t size);
  FileWriteError failure(const std::string& reason) const;

  std::string path_;       // as given, for messages
  std::string target_;     // what the rename replaces: `path_` with symlinks resolved
  std::string temporary_;  // empty when writing the target in place
  bool replaces_file_ = false;
  int fd_ = -1;
  std::string error_;      // the first failed write's reason
  bool committed_ = false;
};

void write_file_atomically(const std::string& path, std::string_view bytes);
// `produce` writes the content through the sink it is given.
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce);
// The module as torch::jit::Module::save writes it (Python's torch.jit.load reads it), with
// `extra_files` (name -> content) in the archive's extra/ folder (torch.jit.load's _extra_files).
void write_file_atomically(const std::string& path, const torch::jit::Module& module,
                           const std::unordered_map<std::string, std::string>& extra_files = {});
void write_file_atomically(const std::string& path, torch::serialize::OutputArchive& archive);

// Throws Error "PATH (FLAG): its directory does not exist" (or "is not writable") for an output
// that could not be written: checked before a long run rather than after it. An empty path passes.
void check_writable(const std::string& path, const std::string& flag);

}  // namespace afterburner
