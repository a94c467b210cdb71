// The training loop: mixed precision, gradient accumulation and clipping, checkpoints and
// exact resume, evaluation, time to a target accuracy, and callbacks.
//
//   Trainer trainer(model, std::move(optimizer), schedule, train_loader, test_loader,
//                   TrainerOptions().epochs(5).precision(Precision::bf16).model_name("cnn"));
//   trainer.add_callback(std::make_shared<ProgressBar>(ProgressMode::automatic));
//   TrainReport report = trainer.fit();
//
//   double loss = trainer.forward_backward(batch);   // or one step at a time
//   inspect(trainer.model().parameters());           // the gradients of this step
//   trainer.optimizer_step();
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/data/device.h"
#include "afterburner/data/loader.h"
#include "afterburner/profile/step_timer.h"
#include "afterburner/train/bf16_weights.h"
#include "afterburner/train/callbacks.h"
#include "afterburner/train/checkpoint.h"
#include "afterburner/train/model.h"
#include "afterburner/train/optim.h"
#include "afterburner/train/precision.h"
#include "afterburner/train/replicas.h"
#include "afterburner/train/report.h"

namespace afterburner::train {

// loss(logits, targets) -> mean loss over the batch.
using LossFunction = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;
LossFunction plain_cross_entropy();

struct TrainerOptions {
  TORCH_ARG(std::string, model_name) = "model";  // guards checkpoints against another model
  TORCH_ARG(int64_t, epochs) = 1;
  TORCH_ARG(LossFunction, loss) = plain_cross_entropy();
  TORCH_ARG(Precision, precision) = Precision::fp32;
  TORCH_ARG(int64_t, accumulate) = 1;
  TORCH_ARG(double, clip_grad_norm) = 0;
  TORCH_ARG(double, clip_grad_value) = 0;
  TORCH_ARG(std::string, checkpoint_path) = "";  // empty: no checkpoints
  TORCH_ARG(int64_t, checkpoint_every) = 0;      // optimizer steps; epoch ends always checkpoint
  TORCH_ARG(double, target_accuracy) = 0;
  TORCH_ARG(int64_t, eval_every) = 0;
  TORCH_ARG(int64_t, max_steps) = 0;
  TORCH_ARG(bool, skip_nonfinite) = false;
  TORCH_ARG(GradScalerOptions, scaler) = GradScalerOptions().enabled(false);
  // bf16 training of a TorchScript model with a flat optimizer: the weights its forward only hands
  // to convolutions and linear layers are read from bf16 copies (bf16_weights.h), and their
  // gradients, between forward_backward() and optimizer_step(), are the copies' (bf16_weights()).
  // Off by itself where gradients are summed over micro-batches or read before the step
  // (accumulate, clipping, loss scaling, replicas).
  TORCH_ARG(bool, bf16_weights) = true;
  // Where the model lives; batches are staged there (pinned, asynchronous copies on CUDA).
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  // Data-parallel training: the loaders hold this rank's shards; gradients, losses, stop
  // decisions and evaluations are combined over the ranks, and only rank 0 saves checkpoints.
  TORCH_ARG(std::shared_ptr<Replicas>, replicas) = nullptr;
};

// A run that failed after training some steps: its report (stop_reason "failed", `error` the
// message) for the caller to write, beside the checkpoint the Trainer wrote.
class TrainingFailure : public TrainingError {
 public:
  explicit TrainingFailure(TrainReport report) : TrainingError(report.error), report_(std::move(report)) {}
  const TrainReport& report() const { return report_; }

 private:
  TrainReport report_;
};

class Trainer {
 public:
  // `model`: any module holder with forward(Tensor) -> Tensor, or a TorchScript module (model.h).
  Trainer(Model model, std::unique_ptr<torch::optim::Optimizer> optimizer,
          LrSchedule schedule, data::Loader& train, data::Loader& test, TrainerOptions options);

  void add_callback(CallbackPtr callback);
  // Restores everything from the checkpoint at options().checkpoint_path(); fit() continues there.
  void resume();
  // Trains until the epochs, max_steps, the target accuracy, a callback or Ctrl-C
  // (interrupt.h) stop it. Errors name the step (or the evaluation after one) and the
  // precision. One after this run's first step does not lose the run: the checkpoint of the
  // last completed step is written and TrainingFailure carries the report so far.
  TrainReport fit();
  EvalResult evaluate();

  // One step as fit() runs it, in two calls so that the gradients can be looked at in between:
  // forward_backward() for each of the step's accumulate() micro-batches, then optimizer_step().
  //
  // Forward (under autocast) and backward of one micro-batch; returns its (unscaled) loss, and
  // skips the backward when that loss is not finite (unless replicas wait for it). With replicas,
  // `last_of_step` says whether this backward averages the gradients over the ranks.
  double forward_backward(const data::Batch& batch, bool last_of_step = true);
  // Sets the step's learning rate (the schedule's, or `lr` for a range test), clips, steps (unless
  // the scaler finds inf/NaN), clears the gradients and counts the step in state().step; false if
  // the step was skipped.
  bool optimizer_step(std::optional<double> lr = std::nullopt);

  const TrainState& state() const { return state_; }
  Model& model() { return model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // The weights the training forward reads in bf16, or nullptr.
  const Bf16Weights* bf16_weights() const { return bf16_weights_.get(); }
  const TrainerOptions& options() const { return options_; }

 private:
  struct StepTotals;
  void discard_gradients();
  // The step's losses and samples, summed over the ranks.
  StepTotals step_totals(double loss_sum, int64_t micro_batches, int64_t samples, double nonfinite_loss);
  // Throws TrainingError naming the step (and the rank), or with skip_nonfinite drops the step's gradients.
  void skip_nonfinite_loss(const StepTotals& totals, TrainReport& report);
  // Whether any rank wants to stop (a callback's time or profile limit); sets stop_reason_ if so.
  void agree_to_stop();
  bool run_epoch(TrainReport& report);
  // The epochs until a stop, then the last evaluation.
  void train_epochs(TrainReport& report);
  // The one line saying where (step or evaluation, precision) `e` stopped the run.
  std::string failure(const std::exception& e) const;
  // Writes the checkpoint of the last completed step and records the failure in `report`.
  void keep_after_failure(const std::exception& e, TrainReport& report);
  // The report's totals, timing and stop reason.
  void finish(TrainReport& report);
  // Evaluation, checkpoint and stop checks due after step `info`; true to stop.
  bool after_step(const StepInfo& info, TrainReport& report);
  // Evaluates, records the result in `report` and tells whether the target is reached.
  void evaluate_into(bool epoch_end, TrainReport& report);
  void save();
  void update_stop_reason();
  double train_seconds() const;
  StepInfo step_info(int64_t epoch, int64_t samples, double loss) const;

  Model model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<Bf16Weights> bf16_weights_;
  LrSchedule schedule_;
  data::Loader& train_;
  data::Loader& test_;
  TrainerOptions options_;
  GradScaler scaler_;
  TrainState state_;
  TrainState completed_;  // state_ as the last completed step left it
  bool evaluating_ = false;
  std::optional<int64_t> checkpointed_step_;  // of the last checkpoint this run wrote
  double resumed_seconds_ = 0;
  profile::StepTimer timer_;
  std::vector<CallbackPtr> callbacks_;
  std::string stop_reason_;
  int64_t last_eval_step_ = -1;
  int64_t rank_ = 0, world_size_ = 1;
};

}  // namespace afterburner::train
