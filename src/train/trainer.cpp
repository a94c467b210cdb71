#include "afterburner/train/trainer.h"

#include <torch/torch.h>

#include <cmath>

#include "afterburner/core/error.h"
#include "afterburner/core/heap.h"
#include "afterburner/kernels/flat_optim.h"
#include "afterburner/profile/memory.h"
#include "afterburner/train/interrupt.h"

namespace afterburner::train {

using profile::Phase;

LossFunction plain_cross_entropy() {
  return [](const torch::Tensor& logits, const torch::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), targets);
  };
}

Trainer::Trainer(Model model, std::unique_ptr<torch::optim::Optimizer> optimizer,
                 LrSchedule schedule, data::Loader& train, data::Loader& test, TrainerOptions options)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      schedule_(std::move(schedule)),
      train_(train),
      test_(test),
      options_(std::move(options)),
      scaler_(options_.scaler()) {
  if (options_.replicas()) {
    rank_ = options_.replicas()->rank();
    world_size_ = options_.replicas()->world_size();
  }
  if (options_.accumulate() < 1) throw UsageError("accumulate", "must be at least 1");
  check_precision_supported(options_.precision(), options_.device());
  model_.to(options_.device());
  if (options_.precision() == Precision::fp16 && !options_.scaler().enabled()) {
    // fp16 gradients underflow without loss scaling.
    scaler_ = GradScaler(options_.scaler().enabled(true));
  }
  auto* flat = dynamic_cast<kernels::FlatOptimizer*>(optimizer_.get());
  // The copies give autocast's bits where each gradient is one backward's and only the step reads it.
  const bool one_backward_per_step = options_.accumulate() == 1 && !options_.replicas();
  const bool gradients_read_by_step_only =
      options_.clip_grad_norm() == 0 && options_.clip_grad_value() == 0 && !scaler_.enabled();
  if (options_.bf16_weights() && options_.precision() == Precision::bf16 && flat != nullptr &&
      options_.device().is_cpu() && one_backward_per_step && gradients_read_by_step_only) {
    bf16_weights_ = std::make_unique<Bf16Weights>(model_, *flat);
    if (bf16_weights_->size() == 0) bf16_weights_.reset();
  }
}

void Trainer::add_callback(CallbackPtr callback) { callbacks_.push_back(std::move(callback)); }

void Trainer::resume() {
  state_ = load_checkpoint(options_.checkpoint_path(),
                           {options_.model_name(), model_, *optimizer_, scaler_, {}});
  if (state_.world_size != world_size_) {
    throw CheckpointError(options_.checkpoint_path(),
                          fmt::format("was written by a run of {} rank(s) and this run has {}: their data orders "
                                      "differ, so resume with as many ranks (--nproc, --nnodes)",
                                      state_.world_size, world_size_));
  }
  resumed_seconds_ = state_.train_seconds;
}

double Trainer::train_seconds() const { return resumed_seconds_ + timer_.recorded_seconds(); }

void Trainer::save() {
  if (options_.checkpoint_path().empty() || rank_ != 0) return;  // the ranks' states are identical
  TrainState state = state_;
  state.train_seconds = train_seconds();
  state.world_size = world_size_;
  save_checkpoint(options_.checkpoint_path(), {options_.model_name(), model_, *optimizer_, scaler_, state});
  checkpointed_step_ = state.step;
}

double Trainer::forward_backward(const data::Batch& batch, bool last_of_step) {
  const auto& replicas = options_.replicas();
  // The other ranks wait for this rank's gradients in a synchronised backward, finite or not.
  const bool synchronised = replicas && last_of_step;
  timer_.start(Phase::forward);
  if (replicas) replicas->before_forward(synchronised);
  torch::Tensor loss;
  {
    std::optional<Bf16Weights::InForward> reading_bf16_copies;
    if (bf16_weights_) reading_bf16_copies.emplace(*bf16_weights_);
    AutocastGuard autocast(options_.precision(), options_.device());
    auto logits = model_.forward(batch.input);
    loss = options_.loss()(logits, batch.target);
  }
  double value = loss.item<double>();
  if (!std::isfinite(value) && !synchronised) return value;
  timer_.start(Phase::backward);
  if (synchronised) replicas->before_backward();
  scaler_.scale(loss / double(options_.accumulate())).backward();
  return value;
}

// Flat optimizers zero their gradient buffer in one pass and keep the gradients inside it;
// otherwise gradients are released (set to none) rather than zero-filled.
void Trainer::discard_gradients() {
  if (auto* flat = dynamic_cast<kernels::FlatOptimizer*>(optimizer_.get())) {
    flat->zero_grad();
  } else {
    model_.zero_grad();
  }
}

bool Trainer::optimizer_step(std::optional<double> lr) {
  timer_.start(Phase::optimizer);
  if (lr) {
    set_lr(*optimizer_, *lr);
  } else {
    schedule_.apply(*optimizer_, state_.step);
  }
  if (options_.clip_grad_norm() > 0 || options_.clip_grad_value() > 0) {
    scaler_.unscale(*optimizer_);  // clip the true gradients, not the scaled ones
    if (options_.clip_grad_value() > 0) {
      torch::nn::utils::clip_grad_value_(model_.parameters(), options_.clip_grad_value());
    }
    if (options_.clip_grad_norm() > 0) {
      torch::nn::utils::clip_grad_norm_(model_.parameters(), options_.clip_grad_norm());
    }
  }
  bool stepped = scaler_.step(*optimizer_);
  scaler_.update();
  discard_gradients();
  ++state_.step;
  return stepped;
}

StepInfo Trainer::step_info(int64_t epoch, int64_t samples, double loss) const {
  StepInfo info;
  info.epoch = epoch;
  info.epochs = options_.epochs();
  info.step = state_.step;
  info.batch_in_epoch = state_.batch_in_epoch;
  info.batches_per_epoch = train_.batches_per_epoch();
  info.samples = samples;
  info.loss = loss;
  info.lr = schedule_.lr_at(state_.step - 1);
  info.rss_mb = profile::current_rss_mb();
  info.tensor_mb = double(profile::TensorMemory::current_bytes()) / (1 << 20);
  info.phase_seconds = timer_.last_step();
  info.train_seconds = train_seconds();
  return info;
}

EvalResult Trainer::evaluate() {
  release_freed_memory();  // the training steps' cached blocks would stack under evaluation's
  torch::InferenceMode inference;
  model_.train(false);
  EvalResult result;
  int64_t correct = 0;
  double loss_sum = 0;
  for (auto& batch : data::Prefetcher(test_.epoch(0), options_.device())) {
    AutocastGuard autocast(options_.precision(), options_.device());
    auto logits = model_.forward(batch.input).to(torch::kFloat);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, batch.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(batch.target).sum().item<int64_t>();
    result.samples += batch.target.size(0);
  }
  model_.train();
  if (options_.replicas()) {  // each rank evaluated its part of the evaluation set
    auto totals = torch::tensor({double(correct), loss_sum, double(result.samples)}, torch::kDouble);
    options_.replicas()->sum(totals);
    correct = static_cast<int64_t>(totals[0].item<double>());
    loss_sum = totals[1].item<double>();
    result.samples = static_cast<int64_t>(totals[2].item<double>());
  }
  if (result.samples > 0) {
    result.accuracy = double(correct) / double(result.samples);
    result.loss = loss_sum / double(result.samples);
  }
  return result;
}

void Trainer::evaluate_into(bool epoch_end, TrainReport& report) {
  timer_.stop();
  evaluating_ = true;
  EvalInfo info;
  info.epoch = state_.epoch;
  info.step = state_.step;
  info.epoch_end = epoch_end;
  info.train_seconds = train_seconds();
  auto eval_start = std::chrono::steady_clock::now();
  info.result = evaluate();
  report.eval_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
  last_eval_step_ = state_.step;
  report.test_accuracy = info.result.accuracy;
  evaluating_ = false;
  report.evaluations.push_back({state_.step, state_.samples, info.train_seconds, info.result.accuracy, info.result.loss});
  if (epoch_end) report.test_accuracy_per_epoch.push_back(info.result.accuracy);
  for (auto& callback : callbacks_) callback->on_evaluation(info);
  if (options_.target_accuracy() > 0 && info.result.accuracy >= options_.target_accuracy() &&
      !report.train_seconds_to_target) {
    report.train_seconds_to_target = state_.seconds_to_target = info.train_seconds;
    report.samples_to_target = state_.samples_to_target = state_.samples;
    stop_reason_ = "target accuracy reached";
  }
}

void Trainer::update_stop_reason() {
  if (!stop_reason_.empty()) return;
  if (options_.max_steps() > 0 && state_.step >= options_.max_steps()) stop_reason_ = "max steps";
  for (auto& callback : callbacks_) {
    if (stop_reason_.empty()) stop_reason_ = callback->stop_reason();
  }
  if (stop_reason_.empty() && interrupt_requested()) stop_reason_ = "interrupted";
}

void Trainer::agree_to_stop() {
  if (!options_.replicas()) return;
  auto votes = torch::tensor({stop_reason_.empty() ? 0.0 : 1.0}, torch::kDouble);
  options_.replicas()->sum(votes);
  if (votes.item<double>() > 0 && stop_reason_.empty()) stop_reason_ = "another rank stopped";
}

bool Trainer::after_step(const StepInfo& info, TrainReport& report) {
  for (auto& callback : callbacks_) callback->on_step_end(info);
  if (options_.checkpoint_every() > 0 && state_.step % options_.checkpoint_every() == 0) save();
  if (options_.eval_every() > 0 && state_.step % options_.eval_every() == 0) {
    evaluate_into(/*epoch_end=*/false, report);
  }
  update_stop_reason();
  agree_to_stop();
  return !stop_reason_.empty();
}

struct Trainer::StepTotals {
  double loss_sum = 0;  // of the finite micro-batch losses
  int64_t micro_batches = 0, samples = 0;
  int64_t nonfinite_rank = -1;  // the first rank with a loss that is not finite
  double nonfinite_loss = 0;    // that loss, when it is this rank's
};

Trainer::StepTotals Trainer::step_totals(double loss_sum, int64_t micro_batches, int64_t samples,
                                         double nonfinite_loss) {
  StepTotals totals{loss_sum, micro_batches, samples, std::isfinite(nonfinite_loss) ? -1 : rank_, nonfinite_loss};
  if (!options_.replicas()) return totals;
  // [loss sum, micro-batches, samples, then one slot per rank: 1 where a loss was not finite]
  auto values = torch::zeros({3 + world_size_}, torch::kDouble);
  values[0] = loss_sum;
  values[1] = double(micro_batches);
  values[2] = double(samples);
  values[3 + rank_] = std::isfinite(nonfinite_loss) ? 0.0 : 1.0;
  options_.replicas()->sum(values);
  totals.loss_sum = values[0].item<double>();
  totals.micro_batches = static_cast<int64_t>(values[1].item<double>());
  totals.samples = static_cast<int64_t>(values[2].item<double>());
  auto flags = values.slice(0, 3).nonzero();
  totals.nonfinite_rank = flags.numel() > 0 ? flags[0][0].item<int64_t>() : -1;
  return totals;
}

void Trainer::skip_nonfinite_loss(const StepTotals& totals, TrainReport& report) {
  if (!options_.skip_nonfinite()) {
    const std::string loss = totals.nonfinite_rank == rank_ ? fmt::format("{}", totals.nonfinite_loss) : "not finite";
    const std::string where = world_size_ > 1 ? fmt::format(" on rank {}", totals.nonfinite_rank) : "";
    throw TrainingError(fmt::format("step {} (epoch {}, batch {}): the loss{} is {}; lower --lr, "
                                    "or pass --skip-nonfinite to skip such steps",
                                    state_.step + 1, state_.epoch + 1, state_.batch_in_epoch, where, loss));
  }
  discard_gradients();
  ++report.skipped_steps;
}

// One pass over the rest of the current epoch; returns whether it reached the epoch's end. A step
// is accumulate() micro-batches (fewer at the epoch's end); one loss that is not finite, on any
// rank, stops the run or skips the whole step.
bool Trainer::run_epoch(TrainReport& report) {
  const int64_t per_epoch = train_.batches_per_epoch();
  int64_t micro = 0, samples = 0;
  double loss_sum = 0, nonfinite_loss = 0;
  timer_.start(Phase::data);
  auto step_begin = std::chrono::steady_clock::now();
  for (auto& batch : data::Prefetcher(train_.epoch(state_.epoch, state_.batch_in_epoch), options_.device())) {
    const bool last_of_step = ++micro == options_.accumulate() || state_.batch_in_epoch + 1 == per_epoch;
    double loss = forward_backward(batch, last_of_step);
    ++state_.batch_in_epoch;
    samples += batch.target.size(0);
    (std::isfinite(loss) ? loss_sum : nonfinite_loss) += loss;
    if (!last_of_step) {
      timer_.start(Phase::data);
      continue;
    }
    const StepTotals totals = step_totals(loss_sum, micro, samples, nonfinite_loss);
    micro = samples = 0;
    loss_sum = nonfinite_loss = 0;
    if (totals.nonfinite_rank >= 0) {
      skip_nonfinite_loss(totals, report);
      timer_.start(Phase::data);
      step_begin = std::chrono::steady_clock::now();
      continue;
    }
    if (!optimizer_step()) ++report.skipped_steps;
    timer_.end_step(totals.samples);
    state_.samples += totals.samples;
    completed_ = state_;
    StepInfo info = step_info(state_.epoch, totals.samples, totals.loss_sum / double(totals.micro_batches));
    info.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_begin).count();
    if (after_step(info, report)) break;
    timer_.start(Phase::data);
    step_begin = std::chrono::steady_clock::now();
  }
  timer_.stop();
  return state_.batch_in_epoch >= per_epoch;
}

TrainReport Trainer::fit() {
  TrainReport report;
  report.precision = to_string(options_.precision());
  const int64_t first_step = state_.step;
  completed_ = state_;
  try {
    train_epochs(report);
  } catch (const std::exception& e) {
    timer_.stop();
    if (state_.step == first_step) {  // nothing trained in this run yet: nothing to keep
      if (dynamic_cast<const Error*>(&e)) throw;
      throw TrainingError(failure(e));
    }
    keep_after_failure(e, report);
    finish(report);
    throw TrainingFailure(report);
  }
  finish(report);
  return report;
}

void Trainer::finish(TrainReport& report) {
  auto stats = timer_.stats();
  report.timing = stats;
  report.steps = state_.step;
  report.train_samples_per_sec = stats.samples_per_sec;
  report.train_seconds = train_seconds();
  report.peak_rss_mb = profile::peak_rss_mb();
  report.peak_tensor_mb = double(profile::TensorMemory::peak_bytes()) / (1 << 20);
  report.stop_reason = stop_reason_.empty() ? "completed" : stop_reason_;
  report.checkpointed_step = checkpointed_step_;
  report.world_size = world_size_;
  if (options_.replicas()) report.communication = options_.replicas()->communication();
  for (auto& callback : callbacks_) callback->on_train_end(report);
}

void Trainer::train_epochs(TrainReport& report) {
  model_.train();
  discard_gradients();
  if (state_.seconds_to_target >= 0 && options_.target_accuracy() > 0) {
    report.train_seconds_to_target = state_.seconds_to_target;  // reached before the resume
    report.samples_to_target = state_.samples_to_target;
    stop_reason_ = "target accuracy reached";
  }
  update_stop_reason();
  while (state_.epoch < options_.epochs() && stop_reason_.empty()) {
    const double epoch_start = timer_.stats().total_s;
    bool epoch_done = run_epoch(report);
    report.epoch_seconds.push_back(timer_.stats().total_s - epoch_start);
    if (epoch_done) {
      ++state_.epoch;
      state_.batch_in_epoch = 0;
      completed_ = state_;
      if (last_eval_step_ == state_.step) {
        report.test_accuracy_per_epoch.push_back(report.test_accuracy);  // evaluated at this very step
      } else {
        evaluate_into(/*epoch_end=*/true, report);
      }
      update_stop_reason();
      agree_to_stop();
    }
    save();
  }
  // Stopped mid-epoch: evaluate the model as it ends, unless the user asked to stop now.
  if (last_eval_step_ != state_.step && stop_reason_ != "interrupted") evaluate_into(/*epoch_end=*/false, report);
}

// Where and at what precision the run was when `e` ended it, and `e`'s own line. An error of
// afterburner's already names what it concerns (the step of a NaN loss, a checkpoint's file).
std::string Trainer::failure(const std::exception& e) const {
  if (dynamic_cast<const Error*>(&e)) return e.what();
  const std::string where = evaluating_ ? fmt::format("evaluation after step {}", state_.step)
                                        : fmt::format("step {} (epoch {}, batch {})", state_.step + 1,
                                                      state_.epoch + 1, state_.batch_in_epoch + 1);
  const bool reduced = options_.precision() != Precision::fp32;
  return fmt::format("{} at {} failed: {}{}", where, to_string(options_.precision()), first_line(e),
                     reduced ? "; --precision fp32 may avoid it" : "");
}

// The run trained before `e` stopped it: the checkpoint goes back to the last completed step
// (a step that failed halfway is redone on resume), and the report says what happened.
void Trainer::keep_after_failure(const std::exception& e, TrainReport& report) {
  stop_reason_ = "failed";
  report.error = failure(e);
  state_ = completed_;
  try {
    save();
  } catch (const CheckpointError& unwritable) {
    report.error += fmt::format(" (and the checkpoint was not written: {})", unwritable.what());
  }
}

}  // namespace afterburner::train
