#include "afterburner/train/run.h"

#include <unistd.h>

#include <filesystem>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/train/session.h"

namespace afterburner::train {
namespace {

// Fails before a long run rather than after it when an output cannot be written.
void check_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  auto dir = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(dir)) throw Error(path + " (" + flag + "): its directory does not exist");
  if (::access(dir.c_str(), W_OK) != 0) throw Error(path + " (" + flag + "): its directory is not writable");
}

void write_report(const TrainReport& report, const std::string& path) {
  write_file_atomically(path, report.to_json().dump(2) + '\n');
}

}  // namespace

std::string checkpoint_file(const std::string& checkpoint_dir) {
  return (std::filesystem::path(checkpoint_dir) / "checkpoint.pt").string();
}

TrainReport run_training(const TrainConfig& config, const DataParallelism& parallel) {
  validate(config);
  for (const auto& [path, flag] : {std::pair{config.report, "--report"}, {config.export_path, "--export"},
                                   {config.log_jsonl, "--log-jsonl"}, {config.trace, "--trace"}}) {
    check_writable(path, flag);
  }
  TrainingSession session(config, load_training_data(config), parallel);
  TrainReport report = session.fit();
  if (session.rank() != 0) return report;
  if (!config.export_path.empty()) session.export_model(config.export_path);
  if (!config.report.empty()) write_report(report, config.report);
  return report;
}

}  // namespace afterburner::train
