#include "afterburner/train/history.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace afterburner::train {

void TrainingHistory::Row::absorb(const Row& later) {
  step = later.step;
  epoch = later.epoch;
  train_seconds = later.train_seconds;
  steps += later.steps;
  loss_sum += later.loss_sum;
  samples += later.samples;
  seconds += later.seconds;
  for (std::size_t phase = 0; phase < phases.size(); ++phase) phases[phase] += later.phases[phase];
  rss_mb = later.rss_mb;
  tensor_mb = later.tensor_mb;
}

TrainingHistory::TrainingHistory(std::size_t max_rows) : max_rows_(std::max<std::size_t>(max_rows, 2)) {}

void TrainingHistory::describe(std::string model, std::string evaluated_on) {
  std::lock_guard<std::mutex> lock(mutex_);
  model_ = std::move(model);
  evaluated_on_ = std::move(evaluated_on);
}

void TrainingHistory::on_step_end(const StepInfo& info) {
  Row row;
  row.step = info.step;
  row.epoch = info.epoch;
  row.steps = 1;
  row.train_seconds = info.train_seconds;
  row.loss_sum = info.loss;
  row.samples = static_cast<double>(info.samples);
  row.seconds = info.step_seconds;
  row.phases = info.phase_seconds;
  row.rss_mb = info.rss_mb;
  row.tensor_mb = info.tensor_mb;
  std::lock_guard<std::mutex> lock(mutex_);
  epochs_ = info.epochs;
  pending_.absorb(row);
  if (pending_.steps < stride_) return;
  rows_.push_back(std::exchange(pending_, Row{}));
  if (rows_.size() < max_rows_) return;
  // Full: each pair of rows becomes one, and rows hold twice the steps from here on.
  std::vector<Row> merged;
  merged.reserve(rows_.size() / 2 + 1);
  for (std::size_t i = 0; i < rows_.size(); i += 2) {
    merged.push_back(rows_[i]);
    if (i + 1 < rows_.size()) merged.back().absorb(rows_[i + 1]);
  }
  rows_ = std::move(merged);
  stride_ *= 2;
}

void TrainingHistory::on_evaluation(const EvalInfo& info) {
  std::lock_guard<std::mutex> lock(mutex_);
  evaluations_.push_back(info);
}

void TrainingHistory::on_train_end(const TrainReport& report) {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  report_ = report.to_json();
}

nlohmann::json TrainingHistory::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Row> rows = rows_;
  if (pending_.steps > 0) rows.push_back(pending_);
  nlohmann::json steps;
  for (const char* column : {"step", "epoch", "train_seconds", "loss", "samples_per_sec", "data_ms", "forward_ms",
                             "backward_ms", "optimizer_ms", "rss_mb", "tensor_mb"}) {
    steps[column] = nlohmann::json::array();
  }
  for (const Row& row : rows) {
    const double per_step_ms = 1e3 / static_cast<double>(row.steps);
    steps["step"].push_back(row.step);
    steps["epoch"].push_back(row.epoch);
    steps["train_seconds"].push_back(row.train_seconds);
    const double loss = row.loss_sum / static_cast<double>(row.steps);
    steps["loss"].push_back(std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr));  // a gap
    steps["samples_per_sec"].push_back(row.seconds > 0 ? row.samples / row.seconds : 0.0);
    steps["data_ms"].push_back(row.phases[static_cast<std::size_t>(profile::Phase::data)] * per_step_ms);
    steps["forward_ms"].push_back(row.phases[static_cast<std::size_t>(profile::Phase::forward)] * per_step_ms);
    steps["backward_ms"].push_back(row.phases[static_cast<std::size_t>(profile::Phase::backward)] * per_step_ms);
    steps["optimizer_ms"].push_back(row.phases[static_cast<std::size_t>(profile::Phase::optimizer)] * per_step_ms);
    steps["rss_mb"].push_back(row.rss_mb);
    steps["tensor_mb"].push_back(row.tensor_mb);
  }
  nlohmann::json evaluations{{"step", nlohmann::json::array()},
                             {"train_seconds", nlohmann::json::array()},
                             {"accuracy", nlohmann::json::array()},
                             {"loss", nlohmann::json::array()}};
  for (const EvalInfo& evaluation : evaluations_) {
    evaluations["step"].push_back(evaluation.step);
    evaluations["train_seconds"].push_back(evaluation.train_seconds);
    evaluations["accuracy"].push_back(evaluation.result.accuracy);
    evaluations["loss"].push_back(evaluation.result.loss);
  }
  nlohmann::json out{{"model", model_},
                     {"evaluated_on", evaluated_on_},
                     {"epochs", epochs_},
                     {"finished", finished_},
                     {"stop_reason", finished_ ? report_.value("stop_reason", "") : ""},
                     {"stride", stride_},
                     {"steps", std::move(steps)},
                     {"evaluations", std::move(evaluations)}};
  if (finished_) out["report"] = report_;
  return out;
}

}  // namespace afterburner::train
