// Which sketched layers make a model fastest at inference while it stays accurate enough:
// `afterburner sketch --tune`. The model is a zoo model or a TorchScript file (as `train --model`
// takes them). Every plan (L terms of rank k in each Linear and Conv2d whose sketch costs less;
// for files also m random features in place of each nn.MultiheadAttention) is first measured
// where it will run (frozen for inference, at a batch size), then plans are trained with the
// user's recipe, fastest first, in a binary search for the fastest one whose accuracy on a
// validation split held out of the training set reaches the target; then, layer by layer, the
// chosen plan's ranks (and attentions' numbers of features) step down where that measures faster
// and still reaches it. Speed decides by measurement, not by FLOPs; training decides accuracy.
//
//   afterburner::train::TrainConfig recipe;   // the user's training options
//   recipe.model = "mlp";
//   auto result = afterburner::tune::tune_sketch(recipe, afterburner::tune::SketchTuneOptions().target_accuracy(0.87));
//   std::cout << afterburner::tune::format_sketch_table(result);
//   if (result.chosen) afterburner::tune::write_sketch_outputs(result, "mlp-sketched.pt", "plan.toml", "frontier.svg");
#pragma once

#include <torch/arg.h>
#include <torch/csrc/jit/api/module.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "afterburner/sketch/feature_kernel.h"
#include "afterburner/sketch/plan.h"
#include "afterburner/train/config.h"

namespace afterburner::tune {

using StopFlag = const std::atomic<bool>*;  // as tune.h's

struct SketchTuneOptions {
  // The accuracy a plan must reach on the validation split, in (0, 1]; or, instead, how far below
  // the dense model's own (trained with the same recipe) it may fall, in [0, 1).
  TORCH_ARG(double, target_accuracy) = 0;
  TORCH_ARG(std::optional<double>, max_accuracy_drop) = std::nullopt;
  // Seconds for all training runs, roughly: a run that would overrun it (by the dense run's time)
  // is not started, and the search ends with what it knows.
  TORCH_ARG(double, time_budget) = 600;
  TORCH_ARG(std::vector<int64_t>, terms) = std::vector<int64_t>{1, 2};               // L
  TORCH_ARG(std::vector<int64_t>, ranks) = std::vector<int64_t>{8, 16, 32, 64, 128, 256};  // k
  // m, for files holding nn.MultiheadAttention: each plan with exact attention and with each m
  // (and attention alone, its Linear layers kept).
  TORCH_ARG(std::vector<int64_t>, attention_features) = std::vector<int64_t>{32, 64, 128};
  TORCH_ARG(sketch::FeatureKernel, attention_kernel) = sketch::FeatureKernel::softmax;
  // After the model-wide plans: one layer at a time, the chosen plan with that layer at the next
  // smaller rank (an attention at the next smaller m), where it measures faster, trained, and
  // kept when it still reaches the target; again from each plan kept, until no layer's step down
  // is faster and accurate enough.
  TORCH_ARG(bool, per_layer) = true;
  TORCH_ARG(int64_t, batch_size) = 64;        // the inference batch speeds are measured at
  TORCH_ARG(double, measure_seconds) = 0.5;   // per model and speed measurement
  TORCH_ARG(std::function<void(const std::string&)>, log) = nullptr;  // a line per finished step
  // Set (e.g. by SIGINT under train::StopOnInterrupt, which also ends the training in progress):
  // the search ends, keeping what it trained.
  TORCH_ARG(StopFlag, stop) = nullptr;
};

struct SketchPlan {
  int64_t terms = 0, rank = 0;          // rank 0: Linear and Conv2d kept (0, 0, 0: the dense model)
  int64_t attention_features = 0;       // m; 0: attention kept exact
  sketch::LayerSketches per_layer;      // layers sketched otherwise than (terms, rank)
  std::vector<sketch::LayerPlan> layer_plans;  // each layer: replaced (with L and k) or kept, and why
  std::vector<std::string> layers;      // sketch::describe of each layer
  int64_t parameters = 0;               // trainable
  double samples_per_sec = 0;           // frozen for inference, at the options' batch size
  double speedup = 0;                   // over the dense model's samples/s, measured in the same run
  std::optional<double> accuracy;       // on the validation split, when trained
  double lr = 0;                        // it trained at: the recipe's, or lower where that diverged
  double train_seconds = 0;
  std::string verdict;                  // "chosen", "below the target", "not trained: ...", ...
  bool dense() const { return rank == 0 && attention_features == 0; }
};

struct SketchTuneResult {
  std::string model;
  double target_accuracy = 0;           // as given, or the dense accuracy less the drop allowed
  int64_t batch_size = 0;
  SketchPlan dense;
  std::vector<SketchPlan> plans;        // fastest first
  train::TrainConfig recipe;            // the user's, which every plan trained with
  std::optional<std::size_t> chosen;    // index into plans
  bool interrupted = false;             // the search was stopped; chosen is then the fastest trained plan that reached the target
  std::optional<torch::jit::Module> chosen_model;  // trained, as `train --export` writes it
  // A file's chosen plan before training: the model its plan TOML trains (written beside it).
  std::optional<torch::jit::Module> chosen_initial_model;
  std::vector<std::string> notes;
};

// Throws UsageError for a recipe that sketches already, for a target
// outside (0, 1] or a drop outside [0, 1) (or both or neither given); the data's errors as
// training reports them.
SketchTuneResult tune_sketch(const train::TrainConfig& recipe, const SketchTuneOptions& options);

// Every plan: L, k, parameters, samples/s, speedup, validation accuracy, verdict.
std::string format_sketch_table(const SketchTuneResult& result);

// The chosen plan's model (TorchScript), the plan as TOML (the recipe with the sketch, for
// `afterburner train --config`, its figures in comments) and the accuracy/speed frontier as SVG;
// for a file, also its sketched model before training beside the plan (initial_model_path), which
// the TOML names as its model. Throws Error when no plan was chosen, or naming a file it cannot
// write.
void write_sketch_outputs(const SketchTuneResult& result, const std::string& model_path, const std::string& plan_path,
                          const std::string& frontier_path);

// "mlp-sketched.plan.toml" -> "mlp-sketched.plan.initial.pt": where a file's plan keeps its
// model before training.
std::string initial_model_path(const std::string& plan_path);

// "no sketched plan of mlp reaches 0.95 on the validation split: the most accurate trained,
// L 1 k 256, reached 0.884 (dense 0.889)": the one line of a search that found nothing.
std::string no_plan_message(const SketchTuneResult& result);

}  // namespace afterburner::tune
