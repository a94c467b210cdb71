#include "afterburner/train/run.h"

#include <fmt/format.h>

#include <filesystem>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/monitor/dashboard.h"
#include "afterburner/train/session.h"
#include "afterburner/train/trainer.h"

namespace afterburner::train {
namespace {

bool is_html(const std::string& path) { return std::filesystem::path(path).extension() == ".html"; }

// JSON, or the dashboard page with the run's curves (and the report) inside.
void write_report(const TrainReport& report, const std::string& path, TrainingHistory* history) {
  if (!is_html(path)) return write_file_atomically(path, report.to_json().dump(2) + '\n');
  history->on_train_end(report);  // also of a failed run, whose fit() did not get there
  write_file_atomically(path, monitor::dashboard_page(monitor::DashboardPage()
                                                          .title("afterburner train: " + report.model)
                                                          .data(history->to_json())));
}

// The model and the report, also of a run that failed or was interrupted: what it trained is
// kept. An export that fails fails the run, after the report says so.
void write_outputs(const TrainingSession& session, const TrainConfig& config, TrainReport& report,
                   TrainingHistory* history) {
  if (!config.export_path.empty()) {
    try {
      session.export_model(config.export_path);
      report.written.push_back("the model " + config.export_path);
    } catch (const std::exception& e) {
      report.stop_reason = "failed";
      report.error += fmt::format("{}export after step {} at {} failed: {}", report.error.empty() ? "" : "; ",
                                  report.steps, report.precision, first_line(e));
    }
  }
  if (!config.report.empty()) {
    write_report(report, config.report, history);
    report.written.push_back("the report " + config.report);
  }
}

}  // namespace

std::string checkpoint_file(const std::string& checkpoint_dir) {
  return (std::filesystem::path(checkpoint_dir) / "checkpoint.pt").string();
}

TrainReport run_training(const TrainConfig& config, const DataParallelism& parallel,
                         std::shared_ptr<TrainingHistory> history) {
  validate(config);
  for (const auto& [path, flag] : {std::pair{config.report, "--report"}, {config.export_path, "--export"},
                                   {config.log_jsonl, "--log-jsonl"}, {config.trace, "--trace"}}) {
    check_writable(path, flag);
  }
  TrainingSession session(config, load_training_data(config), parallel);
  if (const sketch::SketchReport* sketched = session.sketch_report(); sketched && session.rank() == 0) {
    for (const auto& layer : sketched->layers) fmt::print(stderr, "afterburner: sketch: {}\n", sketch::describe(layer));
    fmt::print(stderr, "afterburner: sketch: {}\n", sketch::describe(*sketched));
  }
  if (!history && is_html(config.report)) history = std::make_shared<TrainingHistory>();
  if (history && session.rank() == 0) {
    history->describe(config.model, config.validation_split > 0 ? "validation" : "test");
    session.add_callback(history);
  }
  TrainReport report;
  try {
    report = session.fit();
  } catch (const TrainingFailure& failure) {
    report = failure.report();
  }
  if (session.rank() == 0) write_outputs(session, config, report, history.get());
  if (report.stop_reason == "failed") throw TrainingError(report.error + "; " + kept(config, report));
  return report;
}

std::string kept(const TrainConfig& config, const TrainReport& report) {
  std::vector<std::string> written = report.written;
  if (report.checkpointed_step) {
    written.insert(written.begin(), fmt::format("the checkpoint {} of step {} (--resume continues)",
                                                checkpoint_file(config.checkpoint_dir), *report.checkpointed_step));
  }
  if (written.empty()) return "nothing was written (--checkpoint-dir keeps a run that stops early)";
  std::string text = "wrote " + written.front();
  for (size_t i = 1; i < written.size(); ++i) text += (i + 1 == written.size() ? " and " : ", ") + written[i];
  return text;
}

}  // namespace afterburner::train
