#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <optional>

#include "afterburner/core/error.h"
#include "afterburner/core/threads.h"
#include "afterburner/data/dataset.h"
#include "afterburner/data/loader.h"
#include "afterburner/models/zoo.h"
#include "afterburner/train/interrupt.h"
#include "afterburner/train/trainer.h"
#include "quadrants.h"
#include "testing.h"

namespace afterburner::train {
namespace {

struct Harness {
  data::Loader train, test;
  torch::nn::Sequential model;

  explicit Harness(data::DatasetPtr train_set, int workers = 0, int64_t batch = 32,
                   data::DatasetPtr test_set = quadrant_dataset(256, 99))
      : train(train_set, data::LoaderOptions().batch_size(batch).workers(workers).seed(5)),
        test(test_set, data::LoaderOptions().batch_size(128).workers(0).shuffle(false).drop_last(false)),
        model(fresh_model()) {}

  static torch::nn::Sequential fresh_model() {
    torch::manual_seed(1);
    return models::make_model("mlp", models::ModelOptions().image_size(8).num_classes(4));
  }

  Trainer trainer(TrainerOptions options, OptimizerOptions optimizer = OptimizerOptions().lr(0.05),
                  std::string schedule = "cosine") {
    int64_t total = train.batches_per_epoch() * options.epochs() / options.accumulate();
    return Trainer(model, make_optimizer(optimizer, model->parameters()),
                   LrSchedule(ScheduleOptions().kind(schedule), optimizer.lr(), total), train, test,
                   options.model_name("mlp"));
  }
};

std::vector<torch::Tensor> snapshot(torch::nn::Module& model) {
  std::vector<torch::Tensor> params;
  for (const auto& p : model.parameters()) params.push_back(p.detach().clone());
  return params;
}

void expect_bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

}  // namespace

TEST(Trainer, LearnsASimpleProblemAndReportsPerEpochAccuracy) {
  Harness s(quadrant_dataset(2048, 1));
  auto report = s.trainer(TrainerOptions().epochs(3)).fit();
  EXPECT_EQ(report.test_accuracy_per_epoch.size(), 3u);
  EXPECT_GT(report.test_accuracy, 0.8);  // chance is 0.25
  EXPECT_EQ(report.steps, 3 * s.train.batches_per_epoch());
  EXPECT_EQ(report.timing.samples, report.steps * 32);
  EXPECT_EQ(report.stop_reason, "completed");
}

TEST(Trainer, StopsAtTheTargetAccuracyAndReportsTheTimeToIt) {
  Harness s(quadrant_dataset(2048, 1));
  auto report = s.trainer(TrainerOptions().epochs(20).target_accuracy(0.7).eval_every(10)).fit();
  EXPECT_EQ(report.stop_reason, "target accuracy reached");
  EXPECT_GE(report.test_accuracy, 0.7);
  ASSERT_TRUE(report.train_seconds_to_target.has_value());
  EXPECT_LE(*report.train_seconds_to_target, report.train_seconds + 1e-9);
  EXPECT_LT(report.steps, 20 * s.train.batches_per_epoch());
}

// Two micro-batches of 16 with the loss halved give the gradient of one batch of 32.
TEST(Trainer, AccumulationMatchesOneLargeBatch) {
  auto data = quadrant_dataset(64, 2);
  auto sgd = OptimizerOptions().lr(0.1).momentum(0).weight_decay(0);
  Harness large(data, 0, 32), small(data, 0, 16);
  large.trainer(TrainerOptions().max_steps(2), sgd, "constant").fit();
  small.trainer(TrainerOptions().max_steps(2).accumulate(2), sgd, "constant").fit();
  auto a = snapshot(*large.model), b = snapshot(*small.model);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << i;
}

// A range test sets each step's learning rate; the next step without one follows the schedule.
TEST(Trainer, AStepsLearningRateOverridesTheScheduleForThatStepOnly) {
  Harness s(quadrant_dataset(64, 4));
  auto trainer = s.trainer(TrainerOptions(), OptimizerOptions().lr(0.05).momentum(0).weight_decay(0), "constant");
  for (std::optional<double> lr : {std::optional<double>(0.5), std::optional<double>()}) {
    data::Batch batch = *s.train.epoch(0).begin();
    trainer.forward_backward(batch);
    auto before = snapshot(*s.model);
    std::vector<torch::Tensor> grads;
    for (const auto& p : s.model->parameters()) grads.push_back(p.grad().clone());
    trainer.optimizer_step(lr);
    auto after = snapshot(*s.model);
    // Plain SGD: p <- p - lr * grad.
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_TRUE(torch::allclose(after[i], before[i] - lr.value_or(0.05) * grads[i], 1e-6, 1e-7)) << i;
    }
  }
}

// With plain SGD at lr 1 the update is the clipped gradient itself, so its norm is the bound.
TEST(Trainer, ClipsTheGradientNormBeforeTheStep) {
  Harness s(quadrant_dataset(32, 3));
  auto before = snapshot(*s.model);
  s.trainer(TrainerOptions().max_steps(1).clip_grad_norm(0.01),
            OptimizerOptions().lr(1).momentum(0).weight_decay(0), "constant")
      .fit();
  double squared = 0;
  auto after = snapshot(*s.model);
  for (size_t i = 0; i < after.size(); ++i) squared += (after[i] - before[i]).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(squared), 0.01, 1e-4);
}

TEST(Trainer, ClipsGradientValues) {
  Harness s(quadrant_dataset(32, 3));
  auto before = snapshot(*s.model);
  s.trainer(TrainerOptions().max_steps(1).clip_grad_value(1e-4),
            OptimizerOptions().lr(1).momentum(0).weight_decay(0), "constant")
      .fit();
  auto after = snapshot(*s.model);
  for (size_t i = 0; i < after.size(); ++i) {
    // float32 weights near 0.1 round the difference by up to a few 1e-9.
    EXPECT_LE((after[i] - before[i]).abs().max().item<double>(), 1e-4 + 1e-7);
  }
}

// The NaN stops the run at its step; the checkpoint is the step before's, from which a resumed
// run starts at the NaN's batch again.
TEST(Trainer, NonFiniteLossStopsNamingTheStep) {
  testing::TempDir dir;
  const auto checkpoint = (dir / "ckpt.pt").string();
  auto images = torch::rand({64, 1, 8, 8});
  images[40][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  auto data = std::make_shared<data::TensorDataset>(images, torch::zeros({64}, torch::kLong));
  Harness s(data, 0, 16);
  auto trainer = s.trainer(TrainerOptions().epochs(1).checkpoint_path(checkpoint));
  int64_t steps = 0;
  try {
    trainer.fit();
    FAIL() << "expected a TrainingError";
  } catch (const TrainingFailure& e) {
    steps = e.report().steps;
    EXPECT_GT(steps, 0);
    EXPECT_NE(std::string(e.what()).find(fmt::format("step {} ", steps + 1)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nan"), std::string::npos) << e.what();
    EXPECT_EQ(e.report().stop_reason, "failed");
    EXPECT_EQ(e.report().error, e.what());
    EXPECT_EQ(e.report().checkpointed_step, steps);
  }
  Harness again(data, 0, 16);
  auto resumed = again.trainer(TrainerOptions().epochs(1).checkpoint_path(checkpoint));
  resumed.resume();
  EXPECT_EQ(resumed.state().step, steps);
  EXPECT_EQ(resumed.state().batch_in_epoch, steps);
  expect_bitwise_equal(snapshot(*again.model), snapshot(*s.model));
}

// Evaluation fails here (its images have another size than the model takes) after 5 steps:
// the error names the evaluation, the step and the precision, and the run is kept.
TEST(Trainer, AFailedEvaluationKeepsTheTrainedSteps) {
  testing::TempDir dir;
  const auto checkpoint = (dir / "ckpt.pt").string();
  Harness s(quadrant_dataset(512, 3), 0, 32,
            std::make_shared<data::TensorDataset>(torch::rand({16, 1, 9, 9}), torch::zeros({16}, torch::kLong)));
  auto trainer = s.trainer(TrainerOptions().max_steps(5).checkpoint_path(checkpoint));
  try {
    trainer.fit();
    FAIL() << "expected a TrainingFailure";
  } catch (const TrainingFailure& e) {
    EXPECT_EQ(std::string(e.what()).rfind("evaluation after step 5 at fp32 failed: ", 0), 0u) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_EQ(e.report().steps, 5);
    EXPECT_EQ(e.report().checkpointed_step, 5);
    EXPECT_TRUE(e.report().evaluations.empty());
  }
  Harness again(quadrant_dataset(512, 3));
  auto resumed = again.trainer(TrainerOptions().max_steps(5).checkpoint_path(checkpoint));
  resumed.resume();
  EXPECT_EQ(resumed.state().step, 5);
  expect_bitwise_equal(snapshot(*again.model), snapshot(*s.model));
}

// An error before any step is the error, with where: nothing was trained to keep.
TEST(Trainer, AFailedFirstStepNamesItAndKeepsNothing) {
  testing::TempDir dir;
  const auto checkpoint = (dir / "ckpt.pt").string();
  Harness s(std::make_shared<data::TensorDataset>(torch::rand({64, 1, 9, 9}), torch::zeros({64}, torch::kLong)));
  auto trainer = s.trainer(TrainerOptions().epochs(1).checkpoint_path(checkpoint));
  try {
    trainer.fit();
    FAIL() << "expected a TrainingError";
  } catch (const TrainingFailure& e) {
    FAIL() << "nothing was trained, nothing to keep: " << e.what();
  } catch (const TrainingError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("step 1 (epoch 1, batch 1) at fp32 failed: ", 0), 0u) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(checkpoint));
}

// Ctrl-C during step 3: the step ends, the run stops there without evaluating, its checkpoint
// written; a resumed run ends bit for bit where an uninterrupted one does.
TEST(Trainer, CtrlCEndsTheRunAfterTheStepInProgress) {
  struct PressCtrlC : Callback {
    void on_step_end(const StepInfo& info) override {
      if (info.step == 3) std::raise(SIGINT);
    }
  };
  testing::TempDir dir;
  const auto checkpoint = (dir / "ckpt.pt").string();
  auto data = quadrant_dataset(512, 4);
  Harness whole(data);
  whole.trainer(TrainerOptions().max_steps(8)).fit();

  Harness s(data);
  auto trainer = s.trainer(TrainerOptions().max_steps(8).checkpoint_path(checkpoint));
  trainer.add_callback(std::make_shared<PressCtrlC>());
  TrainReport report;
  {
    StopOnInterrupt stop_on_ctrl_c;
    struct sigaction installed {};
    sigaction(SIGINT, nullptr, &installed);
    EXPECT_TRUE(installed.sa_flags & SA_ONSTACK) << "a Ctrl-C inside oneDNN's GEMM would write into the heap";
    report = trainer.fit();
    EXPECT_TRUE(interrupt_requested());
  }
  EXPECT_EQ(report.stop_reason, "interrupted");
  EXPECT_EQ(report.steps, 3);
  EXPECT_EQ(report.checkpointed_step, 3);
  EXPECT_TRUE(report.evaluations.empty());

  Harness again(data);
  auto resumed = again.trainer(TrainerOptions().max_steps(8).checkpoint_path(checkpoint));
  resumed.resume();
  EXPECT_EQ(resumed.fit().stop_reason, "max steps");
  expect_bitwise_equal(snapshot(*again.model), snapshot(*whole.model));
}

TEST(Trainer, NonFiniteLossCanBeSkipped) {
  auto images = torch::rand({64, 1, 8, 8});
  images[40][0][0][0] = std::numeric_limits<float>::infinity();
  auto data = std::make_shared<data::TensorDataset>(images, torch::zeros({64}, torch::kLong));
  Harness s(data, 0, 16);
  auto report = s.trainer(TrainerOptions().epochs(1).skip_nonfinite(true)).fit();
  EXPECT_EQ(report.skipped_steps, 1);
  EXPECT_EQ(report.steps, 3);
  for (const auto& p : s.model->parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
}

// An interrupted run resumed from its checkpoint ends bit for bit where an uninterrupted run
// ends, including the data order, the schedule and the optimizer's momentum.
TEST(Trainer, ResumeContinuesExactly) {
  ThreadsGuard one_thread(1);
  testing::TempDir dir;
  auto data = quadrant_dataset(512, 4);
  auto options = TrainerOptions().epochs(2).checkpoint_path((dir / "ckpt.pt").string());

  Harness whole(data, 2);
  whole.trainer(TrainerOptions(options).checkpoint_path("")).fit();

  Harness first(data, 2);
  first.trainer(TrainerOptions(options).max_steps(21)).fit();  // stops mid-epoch 2
  Harness second(data, 1);  // another worker count: the batches are the same
  auto resumed = second.trainer(options);
  resumed.resume();
  EXPECT_EQ(resumed.state().step, 21);
  EXPECT_EQ(resumed.state().epoch, 1);
  auto report = resumed.fit();
  EXPECT_EQ(report.steps, 2 * whole.train.batches_per_epoch());
  expect_bitwise_equal(snapshot(*second.model), snapshot(*whole.model));
}

TEST(Trainer, ResumingAnotherModelsCheckpointIsAnError) {
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  Harness s(quadrant_dataset(64, 5));
  s.trainer(TrainerOptions().max_steps(1).checkpoint_path(path)).fit();
  Harness other(quadrant_dataset(64, 5));
  auto trainer = Trainer(other.model, make_optimizer(OptimizerOptions(), other.model->parameters()),
                         LrSchedule(ScheduleOptions(), 0.05, 10), other.train, other.test,
                         TrainerOptions().model_name("cnn").checkpoint_path(path));
  try {
    trainer.resume();
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("mlp"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace afterburner::train
