#include "afterburner/tune/sketch_tune.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/infer/measure.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/models/zoo.h"
#include "afterburner/sketch/script.h"
#include "afterburner/sketch/sequential.h"
#include "afterburner/train/session.h"
#include "afterburner/train/trainer.h"
#include "svg.h"

namespace afterburner::tune {
namespace {

namespace fs = std::filesystem;
using train::TrainConfig;

constexpr double kSketchValidationSplit = 0.1;
constexpr int kLearningRateRetries = 2;  // each at a quarter of the last rate  // held out of the training set when the recipe holds none

// A directory of this process's own for the exported candidates, removed with it.
class ScratchDirectory {
 public:
  ScratchDirectory()
      : path_(fs::temp_directory_path() / fmt::format("afterburner-sketch-tune-{}", static_cast<long>(::getpid()))) {
    fs::create_directories(path_);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

bool is_zoo_model(const std::string& name) {
  const auto& zoo = models::model_names();
  return std::find(zoo.begin(), zoo.end(), name) != zoo.end();
}

// "L 2 k 32", "L 1 k 16 m 64", "m 64" (attention alone), "L 1 k 64, fc2 at k 32" (per layer), "dense".
std::string plan_name(const SketchPlan& plan) {
  if (plan.dense()) return "dense";
  std::vector<std::string> parts;
  if (plan.rank > 0) parts.push_back(fmt::format("L {} k {}", plan.terms, plan.rank));
  if (plan.attention_features > 0) parts.push_back(fmt::format("m {}", plan.attention_features));
  std::string name = fmt::format("{}", fmt::join(parts, " "));
  for (const auto& [layer, sketch] : plan.per_layer) {
    if (sketch.features > 0) {
      name += fmt::format(", {} at m {}", layer, sketch.features);
    } else {
      name += sketch.terms == plan.terms ? fmt::format(", {} at k {}", layer, sketch.rank)
                                         : fmt::format(", {} at L {} k {}", layer, sketch.terms, sketch.rank);
    }
  }
  return name;
}

// The plan as a file name: "L2-k32-m64".
std::string plan_file_stem(const SketchPlan& plan) {
  return fmt::format("L{}-k{}-m{}", plan.terms, plan.rank, plan.attention_features);
}

// The plan's sketch of a TorchScript file.
sketch::SketchConfig file_sketch(const SketchPlan& plan, sketch::FeatureKernel kernel) {
  return sketch::SketchConfig()
      .terms(std::max<int64_t>(plan.terms, 1))
      .rank(plan.rank)
      .attention_features(plan.attention_features)
      .attention_kernel(kernel)
      .layers(plan.per_layer);
}

// The next value below `value` among the searched ones (ranks k, or features m), or 0.
int64_t next_smaller(const std::vector<int64_t>& searched, int64_t value) {
  int64_t smaller = 0;
  for (const int64_t v : searched) {
    if (v < value) smaller = std::max(smaller, v);
  }
  return smaller;
}

// Whether two plans sketch every layer alike (a per-layer plan can equal a model-wide one).
bool same_layers(const SketchPlan& a, const SketchPlan& b) {
  auto same = [](const sketch::LayerPlan& x, const sketch::LayerPlan& y) {
    return x.name == y.name && x.terms == y.terms && x.rank == y.rank && x.random_features == y.random_features;
  };
  return std::equal(a.layer_plans.begin(), a.layer_plans.end(), b.layer_plans.begin(), b.layer_plans.end(), same);
}

// A per-layer step must measure this much faster than the plan it starts from: less is noise.
constexpr double kPerLayerMargin = 1.05;

// How many layers of each kind the report replaced: {Linear and Conv2d, attention}.
std::pair<int64_t, int64_t> replaced_by_kind(const sketch::SketchReport& report) {
  std::pair<int64_t, int64_t> counts{0, 0};
  for (const auto& layer : report.layers) {
    if (!layer.replaced()) continue;
    ++(layer.kind == sketch::LayerKind::attention ? counts.second : counts.first);
  }
  return counts;
}

std::string plan_verdict_chosen(const SketchPlan& plan, double recipe_lr) {
  return plan.lr == recipe_lr ? "chosen" : fmt::format("chosen (at lr {:g}: the recipe's diverged)", plan.lr);
}

TrainConfig sketched(TrainConfig config, const SketchPlan& plan) {
  config.sketch = plan.terms > 0;
  config.sketch_terms = plan.terms > 0 ? plan.terms : 1;
  config.sketch_rank = plan.rank;
  config.sketch_layers = sketch::format_layer_sketches(plan.per_layer);
  return config;
}

class SketchSearch {
 public:
  SketchSearch(const TrainConfig& recipe, const SketchTuneOptions& options) : options_(options), recipe_(recipe) {
    check(recipe, options);
    recipe_.progress = "none";
    recipe_.export_path.clear();
    recipe_.report.clear();
    recipe_.target_accuracy = 0;  // each plan trains its whole recipe: its accuracy is what it reaches
    if (recipe_.validation_split <= 0) recipe_.validation_split = kSketchValidationSplit;
    result_.recipe = recipe;
    result_.recipe.target_accuracy = 0;  // the search's target, not an early stop of the recipe
    result_.model = recipe.model;
    result_.target_accuracy = options.target_accuracy();
    result_.batch_size = options.batch_size();
  }

  SketchTuneResult run() {
    data_ = train::load_training_data(recipe_);
    result_.dense = measured_plan(SketchPlan());
    if (!train(result_.dense) && result_.interrupted) return std::move(result_);
    if (!result_.dense.accuracy) {
      throw Error("the dense " + recipe_.model + " does not train with this recipe: " + result_.dense.verdict);
    }
    dense_seconds_ = result_.dense.train_seconds;
    if (const auto drop = options_.max_accuracy_drop()) result_.target_accuracy = *result_.dense.accuracy - *drop;
    log(fmt::format("dense: {:.0f} samples/s at batch {}, validation accuracy {:.4f} after {:.1f} s of training",
                    result_.dense.samples_per_sec, options_.batch_size(), *result_.dense.accuracy, dense_seconds_));
    gather_plans();
    search();
    if (options_.per_layer()) refine_per_layer();
    return std::move(result_);
  }

 private:
  static void check(const TrainConfig& recipe, const SketchTuneOptions& options) {
    if (recipe.sketch) throw UsageError("--sketch", "sketch --tune chooses the sketch itself; drop --sketch");
    if (const auto drop = options.max_accuracy_drop()) {
      if (options.target_accuracy() != 0) {
        throw UsageError("--max-accuracy-drop", "give it or --target-accuracy, not both");
      }
      if (!(*drop >= 0 && *drop < 1)) throw UsageError("--max-accuracy-drop", fmt::format("must be in [0, 1), got {}", *drop));
    } else if (!(options.target_accuracy() > 0 && options.target_accuracy() <= 1)) {
      throw UsageError("--target-accuracy", fmt::format("must be in (0, 1], got {} (or give --max-accuracy-drop)",
                                                        options.target_accuracy()));
    }
    if (options.batch_size() < 1) throw UsageError("--inference-batch", "must be at least 1");
  }

  void log(const std::string& line) const {
    if (options_.log()) options_.log()(line);
  }

  bool stopped() {
    if (options_.stop() && options_.stop()->load()) result_.interrupted = true;
    return result_.interrupted;
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // The plan's model frozen for inference and timed.
  SketchPlan measured_plan(SketchPlan plan) {
    const torch::jit::Module model = file_ ? file_model(plan) : zoo_model(plan);
    if (plan.dense()) {
      for (const auto& parameter : model.parameters()) plan.parameters += parameter.numel();
    }
    torch::jit::Module frozen = infer::prepare_for_inference(infer::optimize(model).model);
    const auto speed = infer::measure(
        frozen, sample_shape(),
        infer::MeasureOptions().batch_sizes({options_.batch_size()}).seconds_per_batch_size(options_.measure_seconds()));
    plan.samples_per_sec = speed.best().samples_per_second;
    return plan;
  }

  void describe_layers(const sketch::SketchReport& report, SketchPlan& plan) const {
    plan.layer_plans = report.layers;
    for (const auto& layer : report.layers) plan.layers.push_back(sketch::describe(layer));
    plan.parameters = report.params_after;
  }

  // A zoo model as training builds it (sketched as planned) and exports it.
  torch::jit::Module zoo_model(SketchPlan& plan) {
    train::TrainingSession session(sketched(recipe_, plan), data_);
    if (const sketch::SketchReport* report = session.sketch_report()) describe_layers(*report, plan);
    const std::string file = scratch_.file("measured.pt");
    session.export_model(file);
    return infer::load_model(file);
  }

  // "initial-L1-k64-m0-3.pt": a file of its own for each model written (plans with layers of their
  // own share their stem).
  std::string scratch_file(const std::string& what, const SketchPlan& plan) {
    return scratch_.file(fmt::format("{}-{}-{}.pt", what, plan_file_stem(plan), ++scratch_files_));
  }

  // The user's file sketched as planned, saved for its training.
  torch::jit::Module file_model(SketchPlan& plan) {
    torch::jit::Module model = infer::load_model(recipe_.model);
    if (plan.dense()) return model;
    describe_layers(sketch::sketch_script(model, file_sketch(plan, options_.attention_kernel())), plan);
    const std::string initial = scratch_file("initial", plan);
    infer::save_model(model, initial);
    initial_files_[plan_name(plan)] = initial;
    return model;
  }

  // Why the plan is not searched: a part of it replaces no layer. Empty if every part does.
  std::string replaces_nothing(const SketchPlan& plan) const {
    int64_t layers = 0, attention = 0;
    if (file_) {
      torch::jit::Module model = infer::load_model(recipe_.model);
      std::tie(layers, attention) = replaced_by_kind(sketch::sketch_script(model, file_sketch(plan, options_.attention_kernel())));
    } else {
      const auto options = models::ModelOptions()
                               .in_channels(data_.channels)
                               .image_size(data_.image_size)
                               .num_classes(static_cast<int64_t>(data_.classes.size()));
      layers = sketch::sketch_sequential(models::make_model(recipe_.model, options),
                                         sketch::SketchConfig().terms(plan.terms).rank(plan.rank))
                   .report.replaced_count();
    }
    if (plan.rank > 0 && layers == 0) return "no layer's sketch costs less than the layer";
    if (plan.attention_features > 0 && attention == 0) return "no nn.MultiheadAttention is replaced";
    return "";
  }

  // The attention features searched: the options' for a file whose attention can be replaced.
  std::vector<int64_t> attention_features() {
    std::vector<int64_t> features{0};
    if (!file_ || options_.attention_features().empty()) return features;
    SketchPlan probe;
    probe.attention_features = options_.attention_features().front();
    if (const std::string why = replaces_nothing(probe); !why.empty()) {
      result_.notes.push_back("random-feature attention not searched: " + why);
      return features;
    }
    features.insert(features.end(), options_.attention_features().begin(), options_.attention_features().end());
    return features;
  }

  // One sample's shape, as the model takes it.
  std::vector<int64_t> sample_shape() const {
    if (data_.features > 0) return {data_.features};
    return {data_.channels, data_.image_size, data_.image_size};
  }

  // Every plan that sketches at least one layer (each of its parts at least one), measured,
  // fastest first; those not faster than the dense model are listed, not searched.
  void gather_plans() {
    std::vector<std::pair<int64_t, int64_t>> shapes{{1, 0}};  // (L, k); k 0: Linear and Conv2d kept
    for (const int64_t terms : options_.terms()) {
      for (const int64_t rank : options_.ranks()) {
        SketchPlan plan;
        plan.terms = terms;
        plan.rank = rank;
        if (const std::string why = replaces_nothing(plan); !why.empty()) {
          result_.notes.push_back(fmt::format("{}: {}", plan_name(plan), why));
        } else {
          shapes.emplace_back(terms, rank);
        }
      }
    }
    for (const int64_t features : attention_features()) {
      for (const auto& [terms, rank] : shapes) {
        if (stopped()) return;
        SketchPlan plan;
        plan.terms = terms;
        plan.rank = rank;
        plan.attention_features = features;
        if (plan.dense()) continue;
        plan = measured_plan(plan);
        plan.speedup = plan.samples_per_sec / result_.dense.samples_per_sec;
        log(fmt::format("{}: {:.0f} samples/s, {:.2f}x dense", plan_name(plan), plan.samples_per_sec, plan.speedup));
        result_.plans.push_back(std::move(plan));
      }
    }
    std::stable_sort(result_.plans.begin(), result_.plans.end(),
                     [](const SketchPlan& a, const SketchPlan& b) { return a.samples_per_sec > b.samples_per_sec; });
    for (auto& plan : result_.plans) {
      if (plan.speedup <= 1) plan.verdict = "not trained: not faster than dense";
    }
  }

  // The recipe that trains the plan: the zoo model sketched, or the file's sketched copy.
  TrainConfig training_config(const SketchPlan& plan) const {
    if (!file_) return sketched(recipe_, plan);
    TrainConfig config = recipe_;
    if (!plan.dense()) config.model = initial_files_.at(plan_name(plan));
    return config;
  }

  // Trains the plan with the recipe; where its loss turns inf or NaN, again at a quarter of the
  // learning rate, twice at most (a sketched layer's S1s and S2s move its weight by about
  // d_out / k times their own step, so small ranks need smaller rates). False when every attempt
  // failed, which the verdict says.
  bool train(SketchPlan& plan) {
    TrainConfig config = training_config(plan);
    for (int attempt = 0; attempt <= kLearningRateRetries; ++attempt, config.lr /= 4) {
      train::TrainingSession session(config, data_);
      train::TrainReport report;
      try {
        report = session.fit();
      } catch (const train::TrainingFailure& failure) {
        plan.train_seconds += failure.report().train_seconds;
        plan.verdict = fmt::format("training failed at lr {:g}: {}", config.lr, failure.report().error);
        continue;
      }
      if (report.stop_reason == "interrupted") {  // a plan half trained says nothing
        result_.interrupted = true;
        plan.verdict = "interrupted while training";
        return false;
      }
      plan.lr = config.lr;
      plan.accuracy = report.test_accuracy;
      plan.train_seconds += report.train_seconds;
      plan.verdict.clear();
      if (!plan.dense()) {
        const std::string file = scratch_file("trained", plan);
        session.export_model(file);
        trained_files_[plan_name(plan)] = file;
      }
      return true;
    }
    return false;
  }

  // Whether the plan reaches the target, training it if it was not; nullopt when the time budget
  // does not allow its training.
  std::optional<bool> reaches_target(SketchPlan& plan) {
    if (!plan.accuracy) {
      if (elapsed() + 1.2 * dense_seconds_ > options_.time_budget()) {
        plan.verdict = "not trained: the time budget ran out";
        return std::nullopt;
      }
      if (!train(plan)) {
        log(fmt::format("{}: {}", plan_name(plan), plan.verdict));
        return false;
      }
      log(fmt::format("{}: validation accuracy {:.4f} ({:.1f} s of training)", plan_name(plan), *plan.accuracy,
                      plan.train_seconds));
    }
    const bool reached = *plan.accuracy >= result_.target_accuracy;
    plan.verdict = reached ? "reaches the target" : "below the target";
    if (plan.lr != recipe_.lr) plan.verdict += fmt::format(" (at lr {:g}: the recipe's diverged)", plan.lr);
    return reached;
  }

  // Binary search over the plans faster than dense, fastest first, for the first that reaches
  // the target: accuracy rises as plans keep more of the layers (and run slower), so a plan below
  // the target rules out the faster ones, and one reaching it the slower ones. A plan whose
  // training failed says nothing about its neighbours: it leaves the search, which goes on.
  void search() {
    std::vector<std::size_t> order;  // the plans still searched, fastest first
    for (std::size_t i = 0; i < result_.plans.size() && result_.plans[i].speedup > 1; ++i) order.push_back(i);
    std::size_t low = 0, high = order.size();
    while (low < high) {
      if (stopped()) return choose_fastest_reaching("interrupted: the search ended early");
      const std::size_t middle = (low + high) / 2;
      SketchPlan& plan = result_.plans[order[middle]];
      const std::optional<bool> reached = reaches_target(plan);
      if (!reached) {
        return choose_fastest_reaching(fmt::format("the time budget ({:.0f} s) ended the search", options_.time_budget()));
      }
      if (!plan.accuracy) {  // training failed
        order.erase(order.begin() + static_cast<std::ptrdiff_t>(middle));
        --high;
      } else if (*reached) {
        high = middle;
      } else {
        low = middle + 1;
      }
    }
    if (low < order.size()) choose(order[low]);
  }

  // The chosen plan with one layer at the next smaller rank (an attention at the next smaller
  // number of features), measured; nullopt where there is none, the layer's sketch at it costs
  // more than the layer, or it is not faster.
  std::optional<SketchPlan> stepped_down(const SketchPlan& base, const sketch::LayerPlan& layer) {
    const bool attention = layer.kind == sketch::LayerKind::attention;
    const int64_t smaller = attention ? next_smaller(options_.attention_features(), layer.random_features)
                                      : next_smaller(options_.ranks(), layer.rank);
    if (smaller == 0) return std::nullopt;
    SketchPlan plan;
    plan.terms = base.terms;
    plan.rank = base.rank;
    plan.attention_features = base.attention_features;
    plan.per_layer = base.per_layer;
    plan.per_layer[layer.name] = attention ? sketch::LayerSketch{1, 0, smaller} : sketch::LayerSketch{layer.terms, smaller};
    plan = measured_plan(plan);
    const bool stepped = std::any_of(plan.layer_plans.begin(), plan.layer_plans.end(), [&](const sketch::LayerPlan& p) {
      return p.name == layer.name && (attention ? p.random_features : p.rank) == smaller;
    });
    if (!stepped || plan.samples_per_sec < kPerLayerMargin * base.samples_per_sec) return std::nullopt;
    const bool trained_already = std::any_of(result_.plans.begin(), result_.plans.end(), [&](const SketchPlan& other) {
      return other.accuracy && same_layers(other, plan);
    });
    if (trained_already) return std::nullopt;  // e.g. every layer stepped down: a model-wide plan
    plan.speedup = plan.samples_per_sec / result_.dense.samples_per_sec;
    log(fmt::format("{}: {:.0f} samples/s, {:.2f}x dense", plan_name(plan), plan.samples_per_sec, plan.speedup));
    return plan;
  }

  // From the chosen plan, the fastest of its one-layer steps down that still reaches the target
  // becomes the choice, again and again until no step is faster and accurate enough.
  void refine_per_layer() {
    while (result_.chosen && !stopped()) {
      const SketchPlan base = result_.plans[*result_.chosen];
      std::vector<SketchPlan> steps;
      for (const auto& layer : base.layer_plans) {
        if (!layer.replaced()) continue;
        if (stopped()) return;
        if (auto step = stepped_down(base, layer)) steps.push_back(std::move(*step));
      }
      std::stable_sort(steps.begin(), steps.end(),
                       [](const SketchPlan& a, const SketchPlan& b) { return a.samples_per_sec > b.samples_per_sec; });
      const std::size_t first = result_.plans.size();
      for (auto& step : steps) result_.plans.push_back(std::move(step));
      std::optional<std::size_t> better;
      for (std::size_t i = first; i < result_.plans.size() && !better; ++i) {
        const std::optional<bool> reached = reaches_target(result_.plans[i]);
        if (!reached) {
          result_.notes.push_back(fmt::format("the time budget ({:.0f} s) ended the per-layer search", options_.time_budget()));
          break;
        }
        if (*reached) better = i;
      }
      for (std::size_t i = first; i < result_.plans.size(); ++i) {
        SketchPlan& step = result_.plans[i];
        if (!step.accuracy && step.verdict.empty()) step.verdict = "not trained: a faster step reached the target";
      }
      if (!better) break;
      result_.plans[*result_.chosen].verdict = "reaches the target; a per-layer plan is faster";
      choose(*better);
    }
    sort_fastest_first();
  }

  // The plans fastest first again (per-layer plans joined them last), the choice following.
  void sort_fastest_first() {
    const std::optional<std::string> chosen =
        result_.chosen ? std::optional<std::string>(plan_name(result_.plans[*result_.chosen])) : std::nullopt;
    std::stable_sort(result_.plans.begin(), result_.plans.end(),
                     [](const SketchPlan& a, const SketchPlan& b) { return a.samples_per_sec > b.samples_per_sec; });
    for (std::size_t i = 0; chosen && i < result_.plans.size(); ++i) {
      if (plan_name(result_.plans[i]) == *chosen) result_.chosen = i;
    }
  }

  // A search ended early (interrupted, or out of time): the fastest plan trained so far that
  // reached the target, if any.
  void choose_fastest_reaching(const std::string& why) {
    result_.notes.push_back(why + "; its choice is the fastest plan trained so far that reached the target");
    for (std::size_t i = 0; i < result_.plans.size(); ++i) {
      const SketchPlan& plan = result_.plans[i];
      if (plan.accuracy && *plan.accuracy >= result_.target_accuracy) return choose(i);
    }
  }

  void choose(std::size_t index) {
    SketchPlan& chosen = result_.plans[index];
    chosen.verdict = plan_verdict_chosen(chosen, recipe_.lr);
    result_.chosen = index;
    result_.chosen_model = infer::load_model(trained_files_.at(plan_name(chosen)));
    if (file_) result_.chosen_initial_model = infer::load_model(initial_files_.at(plan_name(chosen)));
  }

  SketchTuneOptions options_;
  TrainConfig recipe_;
  train::TrainingData data_;
  SketchTuneResult result_;
  ScratchDirectory scratch_;
  const bool file_ = !is_zoo_model(recipe_.model);  // a TorchScript file, not a zoo model
  std::map<std::string, std::string> initial_files_;  // plan name -> a file's sketched copy, before training
  std::map<std::string, std::string> trained_files_;  // plan name -> the trained model
  double dense_seconds_ = 0;
  std::size_t scratch_files_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

std::string accuracy_text(const SketchPlan& plan) {
  return plan.accuracy ? fmt::format("{:.4f}", *plan.accuracy) : "-";
}

const SketchPlan& chosen_plan(const SketchTuneResult& result) {
  if (!result.chosen || !result.chosen_model) throw Error(no_plan_message(result));
  return result.plans[*result.chosen];
}

std::string plan_toml(const SketchTuneResult& result, const std::string& initial_model) {
  const SketchPlan& plan = chosen_plan(result);
  std::string out = fmt::format(
      "# afterburner sketch --tune: the fastest plan of {} whose validation accuracy reaches {:.4f}.\n"
      "# Validation accuracy {:.4f} (dense {:.4f}); {:.0f} samples/s at batch {} frozen for inference, {:.2f}x the "
      "dense model's {:.0f}; {} trainable parameters (dense {}).\n",
      result.model, result.target_accuracy, *plan.accuracy, *result.dense.accuracy, plan.samples_per_sec,
      result.batch_size, plan.speedup, result.dense.samples_per_sec, plan.parameters, result.dense.parameters);
  for (const auto& layer : plan.layers) out += "#   " + layer + "\n";
  out += "# `afterburner train --config <this file>` trains it again.\n";
  const train::TrainConfig defaults;
  train::TrainConfig config = result.recipe;
  if (result.chosen_initial_model) {
    config.model = initial_model;  // the file sketched as planned, before training
  } else {
    config = sketched(result.recipe, plan);
  }
  config.lr = plan.lr;
  return out + train::to_toml(config, &defaults);
}

std::string frontier_svg(const SketchTuneResult& result) {
  std::vector<svg::Point> trained, dense{{1.0, *result.dense.accuracy}};
  double widest = 1;
  for (const auto& plan : result.plans) {
    widest = std::max(widest, plan.speedup);
    if (plan.accuracy) trained.push_back({plan.speedup, *plan.accuracy});
  }
  std::sort(trained.begin(), trained.end(), [](const svg::Point& a, const svg::Point& b) { return a.x < b.x; });
  std::vector<svg::Series> series{{"sketched plans trained", trained}, {"dense", dense},
                                  {"target", {{1.0, result.target_accuracy}, {widest, result.target_accuracy}}}};
  if (result.chosen) {
    const SketchPlan& plan = result.plans[*result.chosen];
    series.push_back({"chosen: " + plan_name(plan), {{plan.speedup, *plan.accuracy}}});
  }
  return svg::line_chart(fmt::format("sketch --tune: {} at batch {}", result.model, result.batch_size),
                         "inference samples/s over the dense model's (x)", "validation accuracy", series);
}

}  // namespace

SketchTuneResult tune_sketch(const TrainConfig& recipe, const SketchTuneOptions& options) {
  return SketchSearch(recipe, options).run();
}

std::string format_sketch_table(const SketchTuneResult& result) {
  std::string out = fmt::format("{}: validation accuracy at least {:.4f}; samples/s frozen for inference at batch {}\n",
                                result.model, result.target_accuracy, result.batch_size);
  std::size_t width = 16;  // the plan column fits the longest name (per-layer plans' are long)
  for (const auto& plan : result.plans) width = std::max(width, plan_name(plan).size());
  out += fmt::format("{:<{}} {:>11} {:>12} {:>8} {:>10}  {}\n", "plan", width, "parameters", "samples/s", "speedup",
                     "accuracy", "verdict");
  auto row = [&](const SketchPlan& plan) {
    out += fmt::format("{:<{}} {:>11} {:>12.0f} {:>7.2f}x {:>10}  {}\n", plan_name(plan), width, plan.parameters,
                       plan.samples_per_sec, plan.dense() ? 1.0 : plan.speedup, accuracy_text(plan), plan.verdict);
  };
  row(result.dense);
  for (const auto& plan : result.plans) row(plan);
  for (const auto& note : result.notes) out += "note: " + note + "\n";
  return out;
}

void write_sketch_outputs(const SketchTuneResult& result, const std::string& model_path, const std::string& plan_path,
                          const std::string& frontier_path) {
  chosen_plan(result);
  infer::save_model(*result.chosen_model, model_path);
  const std::string initial = initial_model_path(plan_path);
  if (result.chosen_initial_model) infer::save_model(*result.chosen_initial_model, initial);
  write_file_atomically(plan_path, plan_toml(result, initial));
  write_file_atomically(frontier_path, frontier_svg(result));
}

std::string initial_model_path(const std::string& plan_path) {
  const std::string suffix = ".toml";
  const bool toml = plan_path.size() > suffix.size() &&
                    plan_path.compare(plan_path.size() - suffix.size(), suffix.size(), suffix) == 0;
  return (toml ? plan_path.substr(0, plan_path.size() - suffix.size()) : plan_path) + ".initial.pt";
}

std::string no_plan_message(const SketchTuneResult& result) {
  const SketchPlan* best = nullptr;
  for (const auto& plan : result.plans) {
    if (plan.accuracy && (!best || *plan.accuracy > *best->accuracy)) best = &plan;
  }
  const std::string dense = result.dense.accuracy ? fmt::format("{:.4f}", *result.dense.accuracy) : "not trained";
  if (!best) {
    const bool none_faster = std::none_of(result.plans.begin(), result.plans.end(),
                                          [](const SketchPlan& plan) { return plan.speedup > 1; });
    return fmt::format("no sketched plan of {} reaches {:.4g} on the validation split: none was trained{} (dense {})",
                       result.model, result.target_accuracy,
                       none_faster ? fmt::format(", none is faster than the dense model at batch {}", result.batch_size)
                                   : "",
                       dense);
  }
  return fmt::format("no sketched plan of {} reaches {:.4g} on the validation split: the most accurate trained, {}, "
                     "reached {:.4f} (dense {})",
                     result.model, result.target_accuracy, plan_name(*best), *best->accuracy, dense);
}

}  // namespace afterburner::tune
