#include "afterburner/train/callbacks.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "afterburner/core/error.h"

namespace afterburner::train {

ProgressMode parse_progress_mode(const std::string& name) {
  if (name == "auto") return ProgressMode::automatic;
  if (name == "bar") return ProgressMode::bar;
  if (name == "log") return ProgressMode::log;
  if (name == "none") return ProgressMode::none;
  throw UsageError("--progress", "must be auto, bar, log or none, got '" + name + "'");
}

namespace {

std::string clock_text(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

}  // namespace

ProgressBar::ProgressBar(ProgressMode mode)
    : bar_(mode == ProgressMode::bar || (mode == ProgressMode::automatic && ::isatty(STDERR_FILENO))) {}

void ProgressBar::on_step_end(const StepInfo& info) {
  window_samples_ += double(info.samples);
  window_seconds_ += info.step_seconds;
  double rate = window_seconds_ > 0 ? window_samples_ / window_seconds_ : 0;
  int64_t done = info.batch_in_epoch, total = info.batches_per_epoch;
  if (bar_) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100) && done < total) return;
    last_draw_ = now;
    const int width = 24;
    int filled = total > 0 ? int(width * done / total) : 0;
    double eta = rate > 0 ? double(total - done) * double(info.samples) / rate : 0;
    fmt::print(stderr, "\r\033[Kepoch {}/{} [{}{}] {}/{} loss {:.4f} {:.0f} samples/s ETA {}",
               info.epoch + 1, info.epochs, std::string(filled, '#'), std::string(width - filled, '.'),
               done, total, info.loss, rate, clock_text(eta));
    std::fflush(stderr);
    return;
  }
  int64_t tenth = std::max<int64_t>(total / 10, 1);
  if (done % tenth != 0 && done != total) return;
  fmt::print(stderr, "epoch {}/{} batch {}/{} step {} loss {:.4f} lr {:.4g} {:.0f} samples/s\n",
             info.epoch + 1, info.epochs, done, total, info.step, info.loss, info.lr, rate);
  window_samples_ = window_seconds_ = 0;
}

void ProgressBar::on_evaluation(const EvalInfo& info) {
  if (bar_) fmt::print(stderr, "\n");
  fmt::print(stderr, "{} step {}: test accuracy {:.4f}, test loss {:.4f} ({:.1f} s of training)\n",
             info.epoch_end ? "epoch end," : "eval at", info.step, info.result.accuracy, info.result.loss,
             info.train_seconds);
  window_samples_ = window_seconds_ = 0;
}

JsonlLog::JsonlLog(const std::string& path) : out_(path, FileWriter::Mode::stream) {}

void JsonlLog::on_step_end(const StepInfo& i) {
  nlohmann::json line{{"event", "step"}, {"epoch", i.epoch}, {"step", i.step},
                      {"batch", i.batch_in_epoch}, {"samples", i.samples}, {"loss", i.loss},
                      {"lr", i.lr}, {"step_seconds", i.step_seconds}, {"rss_mb", i.rss_mb},
                      {"tensor_mb", i.tensor_mb}};
  out_.write(line.dump() + '\n');
}

void JsonlLog::on_evaluation(const EvalInfo& i) {
  nlohmann::json line{{"event", "eval"}, {"epoch", i.epoch}, {"step", i.step}, {"epoch_end", i.epoch_end},
                      {"train_seconds", i.train_seconds}, {"test_accuracy", i.result.accuracy},
                      {"test_loss", i.result.loss}};
  out_.write(line.dump() + '\n');
}

void JsonlLog::on_train_end(const TrainReport&) { out_.commit(); }

EarlyStopping::EarlyStopping(int64_t patience, double min_delta) : patience_(patience), min_delta_(min_delta) {}

void EarlyStopping::on_evaluation(const EvalInfo& info) {
  if (info.result.accuracy > best_ + min_delta_) {
    best_ = info.result.accuracy;
    since_best_ = 0;
  } else {
    ++since_best_;
  }
}

std::string EarlyStopping::stop_reason() const {
  return since_best_ >= patience_ ? fmt::format("no better accuracy in {} evaluations", patience_) : "";
}

}  // namespace afterburner::train
