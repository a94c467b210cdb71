// Callbacks observe a training run and may ask it to stop.
//
//   trainer.add_callback(std::make_shared<ProgressBar>(ProgressMode::automatic));
//   trainer.add_callback(std::make_shared<JsonlLog>("run.jsonl"));
//   trainer.add_callback(std::make_shared<EarlyStopping>(/*patience=*/3));
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "afterburner/core/file_writer.h"
#include "afterburner/profile/step_timer.h"
#include "afterburner/train/report.h"

namespace afterburner::train {

struct StepInfo {
  int64_t epoch = 0;
  int64_t epochs = 0;
  int64_t step = 0;                // optimizer steps done, this one included
  int64_t batch_in_epoch = 0;      // batches of this epoch consumed
  int64_t batches_per_epoch = 0;
  int64_t samples = 0;             // in this step
  double loss = 0;                 // mean over the step's micro-batches
  double lr = 0;
  double step_seconds = 0;         // data wait + forward + backward + optimizer
  profile::StepTimer::PhaseSeconds phase_seconds{};  // this step's, by profile::Phase
  double train_seconds = 0;        // training time so far, this step's included (across resumes)
  double rss_mb = 0;
  double tensor_mb = 0;
};

struct EvalInfo {
  int64_t epoch = 0;
  int64_t step = 0;
  bool epoch_end = false;
  double train_seconds = 0;        // training time so far
  EvalResult result;
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_step_end(const StepInfo&) {}
  virtual void on_evaluation(const EvalInfo&) {}
  virtual void on_train_end(const TrainReport&) {}
  // Polled after every step and evaluation; a non-empty reason stops the run.
  virtual std::string stop_reason() const { return {}; }
};
using CallbackPtr = std::shared_ptr<Callback>;

enum class ProgressMode { automatic, bar, log, none };  // automatic: bar on a TTY, else log; none: no callback
ProgressMode parse_progress_mode(const std::string& name);

// A one-line progress bar on stderr (epoch, step, loss, samples/s, ETA), or plain log lines
// every 10% of an epoch when stderr is not a terminal.
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(ProgressMode mode);
  void on_step_end(const StepInfo& info) override;
  void on_evaluation(const EvalInfo& info) override;

 private:
  bool bar_;
  double window_samples_ = 0;
  double window_seconds_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

// One JSON object per line: {"event":"step",...} per step, {"event":"eval",...} per evaluation.
// Streamed through a FileWriter (core/file_writer.h): each line reaches the file as it is
// written, so `tail -f` follows the run and a killed run keeps its log; a write that fails (a
// full disk) throws FileWriteError naming the path.
class JsonlLog : public Callback {
 public:
  explicit JsonlLog(const std::string& path);  // throws FileWriteError naming the path if it cannot open
  void on_step_end(const StepInfo& info) override;
  void on_evaluation(const EvalInfo& info) override;
  void on_train_end(const TrainReport& report) override;

 private:
  FileWriter out_;
};

// Stops when the test accuracy has not improved by more than min_delta for `patience` evaluations.
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(int64_t patience, double min_delta = 0);
  void on_evaluation(const EvalInfo& info) override;
  std::string stop_reason() const override;

 private:
  int64_t patience_;
  double min_delta_;
  double best_ = -1;
  int64_t since_best_ = 0;
};

}  // namespace afterburner::train
