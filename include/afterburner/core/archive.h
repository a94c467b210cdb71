// LibTorch's files (TorchScript models, checkpoints, torch.save outputs) are zip archives, and
// LibTorch's zip reader skips the archive's CRC-32 checks: a flipped byte on disk reaches its
// unpickler and TorchScript parser, and a corrupted code record can crash the process (a SEGV in
// ScriptTypeParser, found by fuzzing checkpoints). Every such file we load is checked first:
//
//   check_archive("model.pt");   // throws ArchiveError "model.pt: record archive/data/3 fails its CRC-32 check"
//   auto model = torch::jit::load("model.pt");
//
// The check reads the whole file once (a model of 100 MB: about 50 ms).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "afterburner/core/error.h"

namespace afterburner {

// A file that is no zip archive, is truncated, or holds a record whose bytes do not match its
// CRC-32. what() is "<file>: <problem>".
class ArchiveError : public Error {
 public:
  ArchiveError(const std::string& file, const std::string& problem)
      : Error(file + ": " + problem), problem_(problem) {}
  const std::string& problem() const { return problem_; }

 private:
  std::string problem_;
};

// Reads every record of the zip archive at `path` and checks it against its CRC-32.
void check_archive(const std::string& path);

// Reads the records of the zip archive at `path` in order, as check_archive checks them, handing
// each one's bytes to `chunk` in pieces as they are read (a record's pieces arrive in order, its
// check after its last piece). Throws ArchiveError as check_archive.
using RecordChunk = std::function<void(const std::string& record, const char* bytes, size_t size)>;
void read_archive(const std::string& path, const RecordChunk& chunk);

// The first record whose name ends with `suffix` (a TorchScript file's "/extra/afterburner.json"),
// read and checked against its CRC-32 without reading the others; none when there is no such
// record. Throws ArchiveError as check_archive.
std::optional<std::string> read_archive_record(const std::string& path, const std::string& suffix);

}  // namespace afterburner
