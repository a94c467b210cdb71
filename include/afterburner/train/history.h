// The curves of a training run as it trains, for the dashboard (monitor/dashboard.h): a row per
// optimizer step and one per evaluation. Past `max_rows` steps, neighbouring rows are merged
// (the stride doubles) so that memory and the page stay small over long runs. Thread-safe: the
// training thread records, a dashboard server reads.
//
//   auto history = std::make_shared<afterburner::train::TrainingHistory>();
//   trainer.add_callback(history);
//   nlohmann::json curves = history->to_json();   // see to_json
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "afterburner/train/callbacks.h"

namespace afterburner::train {

class TrainingHistory : public Callback {
 public:
  explicit TrainingHistory(std::size_t max_rows = 2048);

  // What the page's title line names: the model, and what evaluations ran on ("test", "validation").
  void describe(std::string model, std::string evaluated_on);

  void on_step_end(const StepInfo& info) override;
  void on_evaluation(const EvalInfo& info) override;
  void on_train_end(const TrainReport& report) override;  // finished, with the report

  // {"model", "evaluated_on", "epochs", "finished", "stop_reason", "stride" (steps per row),
  //  "steps": {"step", "epoch", "train_seconds", "loss", "samples_per_sec", "data_ms", "forward_ms",
  //            "backward_ms", "optimizer_ms", "rss_mb", "tensor_mb"} (columns, a row per `stride`
  //            steps: loss and phase times their mean, samples/s over the row's time, the rest
  //            its last step's; a loss that is not finite is null),
  //  "evaluations": {"step", "train_seconds", "accuracy", "loss"}, "report" (once finished)}
  nlohmann::json to_json() const;

 private:
  struct Row {
    int64_t step = 0, epoch = 0, steps = 0;
    double train_seconds = 0, loss_sum = 0, samples = 0, seconds = 0;
    profile::StepTimer::PhaseSeconds phases{};
    double rss_mb = 0, tensor_mb = 0;

    void absorb(const Row& later);
  };

  const std::size_t max_rows_;
  mutable std::mutex mutex_;
  std::string model_, evaluated_on_ = "test";
  int64_t epochs_ = 0;
  int64_t stride_ = 1;
  std::vector<Row> rows_;
  Row pending_;  // the steps of a row not yet full
  std::vector<EvalInfo> evaluations_;
  bool finished_ = false;
  nlohmann::json report_;
};

}  // namespace afterburner::train
