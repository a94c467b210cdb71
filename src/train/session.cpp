#include "afterburner/train/session.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <filesystem>

#include "afterburner/core/error.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/memory_format.h"
#include "afterburner/core/threads.h"
#include "afterburner/data/image_pipeline.h"
#include "afterburner/data/image_transforms.h"
#include "afterburner/data/loader.h"
#include "afterburner/data/pack.h"
#include "afterburner/data/sources.h"
#include "afterburner/data/transforms.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/kernels/cross_entropy.h"
#include "afterburner/kernels/fuse.h"
#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "afterburner/profile/memory.h"
#include "afterburner/sketch/sequential.h"
#include "afterburner/train/checkpointed.h"
#include "afterburner/train/profile_steps.h"
#include "afterburner/train/run.h"
#include "afterburner/train/trainer.h"

namespace afterburner::train {
namespace {

Precision resolve_precision(const std::string& name, const torch::Device& device) {
  if (name == "auto") {
    if (device.is_cuda()) return Precision::bf16;
    return cpu_has_native_bf16() ? Precision::bf16 : Precision::fp32;
  }
  Precision precision = parse_precision(name);
  check_precision_supported(precision, device);
  return precision;
}

// Labels beyond the training classes stop the run here, naming the dataset, not inside the loss
// (with --skip-corrupt, those samples are left out); so do images another shape than the
// training ones.
void check_evaluation_set(TrainingData& data, const std::string& source) {
  const data::Batch all = data.evaluation->get_batch(torch::arange(data.evaluation->size()));
  const torch::Tensor kept =
      data::check_labels(all.target, static_cast<int64_t>(data.classes.size()), source, data.skipped.get());
  if (kept.numel() == 0) throw DataError(source, "none of its labels is a training class");
  if (kept.numel() < all.target.numel()) data.evaluation = std::make_shared<data::SubsetDataset>(data.evaluation, kept);
  const data::Batch first_training = data.train->get_batch(torch::zeros({1}, torch::kLong));  // owns the sizes
  const auto train_shape = first_training.input.sizes().slice(1);
  if (all.input.sizes().slice(1) != train_shape) {
    throw DataError(source, fmt::format("evaluation images of shape {}, the training images {}",
                                        c10::str(all.input.sizes().slice(1)), c10::str(train_shape)));
  }
}

// Two images as the model sees them: decoded for evaluation, or the stored ones scaled to [0, 1].
torch::Tensor sample_images(const TrainingData& data) {
  const torch::Tensor first = torch::arange(std::min<int64_t>(2, data.evaluation->size()), torch::kLong);
  if (data.evaluation_transform) return (*data.evaluation_transform)(data.evaluation->get_batch(first), 0).input;
  return data.train->get_batch(torch::arange(2, torch::kLong)).input.to(torch::kFloat).div_(255);
}

// The std batches are divided by: a constant channel or feature keeps its scale (1), as
// scikit-learn's StandardScaler does, rather than dividing by zero.
double divisor(double spread) { return spread > 0 ? spread : 1.0; }

// Exact statistics of uint8 images from each channel's histogram of the 256 pixel values,
// without a floating-point copy of the whole set.
void describe_images(const torch::Tensor& all, TrainingData& stats) {
  if (all.dim() != 4 || all.size(2) != all.size(3)) {
    throw UsageError("--data", "expected square uint8 images [N, C, H, W]");
  }
  stats.channels = all.size(1);
  stats.image_size = all.size(2);
  auto levels = torch::arange(256, torch::kDouble).div_(255.0);
  for (int64_t c = 0; c < stats.channels; ++c) {
    auto counts = torch::bincount(all.select(1, c).flatten(), {}, 256).to(torch::kDouble);
    double n = counts.sum().item<double>();
    double mean = (counts * levels).sum().item<double>() / n;
    double var = (counts * (levels - mean).square()).sum().item<double>() / (n - 1);
    stats.mean.push_back(mean);
    stats.std.push_back(divisor(std::sqrt(var)));
  }
}

// A table's rows are standardised per feature (statistics in double precision).
void describe_features(const torch::Tensor& all, TrainingData& stats) {
  stats.features = stats.channels = all.size(1);
  stats.image_size = 1;  // the zoo's mlp then takes `features` inputs
  const torch::Tensor values = all.to(torch::kDouble);
  const torch::Tensor mean = values.mean(0);
  const torch::Tensor std = all.size(0) > 1 ? values.std(0) : torch::zeros_like(mean);
  for (int64_t f = 0; f < stats.features; ++f) {
    stats.mean.push_back(mean[f].item<double>());
    stats.std.push_back(divisor(std[f].item<double>()));
  }
  stats.train_transform = stats.evaluation_transform = data::normalize(stats.mean, stats.std);
}

void describe_data(const data::Dataset& dataset, TrainingData& stats) {
  const torch::Tensor all = dataset.get_batch(torch::arange(dataset.size())).input;
  if (all.scalar_type() == torch::kByte) return describe_images(all, stats);
  if (all.dim() == 2 && all.scalar_type() == torch::kFloat) return describe_features(all, stats);
  throw UsageError("--data", "expected square uint8 images [N, C, H, W] or float features [N, F], got " +
                                 c10::str(all.scalar_type(), " ", all.sizes()));
}

bool convolves(const Model& model) {
  const auto parameters = model.parameters();
  return std::any_of(parameters.begin(), parameters.end(), [](const torch::Tensor& p) { return p.dim() == 4; });
}

void to_channels_last(const Model& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 4) p.set_data(afterburner::channels_last(p));
  }
}

// With a target, evaluating only at epoch ends would train up to an epoch past it.
int64_t evaluation_interval(const TrainConfig& config, int64_t batches_per_epoch) {
  constexpr int64_t kEvaluationsPerEpoch = 8;
  if (config.eval_every > 0 || config.target_accuracy <= 0) return config.eval_every;
  return std::max<int64_t>(1, batches_per_epoch / config.accumulate / kEvaluationsPerEpoch);
}

// One forward of two training samples (in evaluation mode: no BatchNorm statistics move) before
// training starts, so that a model whose input or output does not fit cross-entropy over the
// dataset's classes stops with one line naming the file, not inside the first step.
void check_model_fits(Model& model, const TrainingData& data, const std::string& name, bool channels_last) {
  const auto classes = static_cast<int64_t>(data.classes.size());
  torch::Tensor images = sample_images(data);
  if (channels_last) images = afterburner::channels_last(images);
  const std::string input = "a batch " + c10::str(images.sizes());
  torch::Tensor logits;
  model.train(false);
  try {
    torch::NoGradGuard no_grad;
    logits = model.forward(images);
  } catch (const std::exception& e) {
    model.train();
    throw UsageError("--model", fmt::format("{}: its forward fails on {}: {}", name, input, first_line(e)));
  }
  model.train();
  if (logits.dim() != 2 || logits.size(0) != 2 || logits.size(1) < classes) {
    throw UsageError("--model", fmt::format("{}: its forward returns {} for {}; cross-entropy over the dataset's {} "
                                            "classes needs [2, {}] logits",
                                            name, c10::str(logits.sizes()), input, classes, classes));
  }
}

int64_t total_steps(const TrainConfig& config, int64_t batches_per_epoch) {
  int64_t per_epoch = (batches_per_epoch + config.accumulate - 1) / config.accumulate;
  int64_t steps = per_epoch * config.epochs;
  return config.max_steps > 0 ? std::min(steps, config.max_steps) : steps;
}

sketch::SketchedSequential sketched(const torch::nn::Sequential& model, const TrainConfig& config) {
  return sketch::sketch_sequential(model, sketch::SketchConfig()
                                              .terms(config.sketch_terms)
                                              .rank(config.sketch_rank)
                                              .budget(config.sketch_rank > 0 ? 0.0 : config.sketch_budget)
                                              .layers(sketch::parse_layer_sketches(config.sketch_layers)));
}

// Returns {training, validation}: `fraction` of `all` held out for evaluation, chosen by a
// permutation seeded with `seed`. A recipe tuned on it is judged on samples it never trained on,
// and never on the test set.
std::pair<data::DatasetPtr, data::DatasetPtr> hold_out(const data::DatasetPtr& all, double fraction, uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  auto order = torch::randperm(all->size(), generator, torch::kLong);
  int64_t held = std::llround(fraction * double(all->size()));
  if (held < 1 || held >= all->size()) {
    throw UsageError("--validation-split", fmt::format("{} of {} training samples leaves no validation or no "
                                                       "training set", fraction, all->size()));
  }
  auto training = order.slice(/*dim=*/0, /*start=*/held), validation = order.slice(/*dim=*/0, 0, held);
  return {std::make_shared<data::SubsetDataset>(all, training), std::make_shared<data::SubsetDataset>(all, validation)};
}

// This rank's part of the data: its shard of the training set, batch_size / world_size samples a
// batch (set in `loader_options`), and every world_size-th sample of `evaluation` (returned).
data::DatasetPtr shard_for_rank(const Replicas& replicas, const TrainConfig& config, data::LoaderOptions& loader_options,
                                const data::DatasetPtr& evaluation) {
  const int64_t world_size = replicas.world_size();
  if (config.batch_size % world_size != 0) {
    throw UsageError("--batch-size",
                     fmt::format("must divide evenly over the {} ranks, got {}", world_size, config.batch_size));
  }
  loader_options.batch_size(config.batch_size / world_size);
  loader_options.shard(data::Shard().rank(replicas.rank()).count(world_size));
  return std::make_shared<data::SubsetDataset>(
      evaluation, torch::arange(replicas.rank(), evaluation->size(), world_size, torch::kLong));
}

// BatchNorm's running statistics, by the buffer names torch.nn.BatchNorm*d registers.
bool has_batch_norm(const torch::jit::Module& script) {
  for (const auto& buffer : script.named_buffers()) {
    const std::string& name = buffer.name;
    if (name == "running_mean" || (name.size() > 13 && name.compare(name.size() - 13, 13, ".running_mean") == 0)) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool is_model_file(const std::string& model) {
  return model.find('/') != std::string::npos || (model.size() > 3 && model.compare(model.size() - 3, 3, ".pt") == 0);
}

torch::jit::Module load_user_model(const TrainConfig& config, const TrainingData& data, bool data_parallel) {
  if (config.sketch) throw UsageError("--sketch", "sketches zoo models; " + config.model + " is trained as written");
  if (!config.checkpoint_layers.empty()) {
    throw UsageError("--checkpoint-layers", "applies to zoo models; " + config.model + " is trained as written");
  }
  torch::jit::Module script = infer::load_model(config.model);
  bool trainable = false;
  for (const auto& parameter : script.parameters()) trainable = trainable || parameter.requires_grad();
  if (!trainable) {
    throw UsageError("--model", config.model + ": none of its parameters requires grad, so there is nothing to train "
                                               "(files from torch.jit.freeze or `afterburner optimize` are for "
                                               "inference)");
  }
  if (data_parallel && has_batch_norm(script)) {
    throw UsageError("--nproc", config.model + " has BatchNorm layers, which would normalise each rank's batch "
                                                "alone (SyncBatchNorm replaces only the zoo's): train it in one process");
  }
  Model plain(script);
  check_model_fits(plain, data, config.model, config.channels_last && convolves(plain));
  script.train();
  return script;
}

namespace {

// --val-data's format: told by what it holds, or --data-format's.
data::DataFormat evaluation_format(const TrainConfig& config, data::DataFormat format) {
  return config.data_format == "auto" ? data::detect_data_format(config.val_data) : format;
}

// The training images' augmentation: --transforms, or --augment's pad2,crop.
data::ImageTransforms training_transforms(const TrainConfig& config) {
  if (config.augment && !config.transforms.empty()) {
    throw UsageError("--augment", "is --transforms pad2,crop: give one of them");
  }
  return data::parse_image_transforms(config.augment ? "pad2,crop" : config.transforms, "--transforms");
}

// Images decoded each epoch: packs, and folders whose transforms crop or resize as they decode,
// unless --decode says.
bool decodes_each_epoch(const TrainConfig& config, data::DataFormat format) {
  const bool cropped = training_transforms(config).decodes();
  if (config.decode == "once" && cropped) {
    throw UsageError("--transforms", config.transforms + " crops images as they are decoded: --decode each-epoch");
  }
  if (config.decode != "auto") return config.decode == "each-epoch";
  return format == data::DataFormat::pack || (format == data::DataFormat::folder && cropped);
}

std::shared_ptr<data::SkippedInputs> skipped_inputs(const TrainConfig& config) {
  return config.skip_corrupt ? std::make_shared<data::SkippedInputs>() : nullptr;
}

[[noreturn]] void no_evaluation_set(const TrainConfig& config, data::DataFormat format) {
  const std::string holds = format == data::DataFormat::csv
                                ? "is one CSV file (a folder of a *train.csv and a *test.csv holds both sets)"
                                : format == data::DataFormat::pack
                                      ? "is one pack (of one image folder)"
                                      : "holds one set of class folders and no val/ or test/ beside a train/";
  throw UsageError("--data", config.data + " " + holds + ": give --val-data PATH or --validation-split F to "
                                                         "evaluate on");
}

// An image folder or a pack decoded by the loader's workers each epoch (data/image_pipeline.h):
// training images with --transforms (RandomResizedCrop and a flip unless given), evaluation ones
// on the centre crop, both normalised by the mean and std of the centre crops of up to
// kStatisticsImages training images (at up to kStatisticsSize pixels: the statistics hardly depend
// on the size).
TrainingData load_each_epoch(const TrainConfig& config, data::DataFormat format) {
  constexpr int64_t kStatisticsImages = 256, kStatisticsSize = 64;
  if (config.augment) {
    throw UsageError("--augment", "pads and shifts stored images; --decode each-epoch crops them at random already");
  }
  const data::ImageTransforms transforms =
      data::parse_image_transforms(config.transforms.empty() ? "rrc,flip" : config.transforms, "--transforms");
  const int64_t size = transforms.side(config.image_size) > 0 ? transforms.side(config.image_size) : 224;
  const data::DecodeOptions training = transforms.decode_options(true, size).channels_last(config.channels_last);
  const bool crops_as_stored = training.crop() != data::Crop::random_resized && training.resize() == 0;
  TrainingData data;
  data.skipped = skipped_inputs(config);
  auto train = data::open_image_records(config.data, format, data::Split::train, {}, data.skipped,
                                        crops_as_stored ? size : 0);
  data.train = train;
  const auto pack = std::dynamic_pointer_cast<const data::PackedImages>(train);
  if (pack) data.format = fmt::format("pack ({})", pack->describe_storage());
  data.block_local = config.shuffle == "block-local" || (config.shuffle == "auto" && pack && pack->larger_than_memory());
  data.classes = train->classes();
  data.evaluated_on = config.validation_split > 0 ? "validation" : "test";
  std::shared_ptr<const data::ImageRecords> evaluated = train;
  if (config.validation_split > 0) {
    std::tie(data.train, data.evaluation) = hold_out(train, config.validation_split, config.seed);
  } else {
    if (config.val_data.empty() && !data::holds_test_split(config.data, format)) no_evaluation_set(config, format);
    if (config.val_data.empty()) {
      evaluated = data::open_image_records(config.data, format, data::Split::test, data.classes, data.skipped);
    } else {
      evaluated = data::open_image_records(config.val_data, evaluation_format(config, format), data::Split::test,
                                           data.classes, data.skipped);
    }
    data.evaluation = evaluated;
  }
  const data::DecodeOptions centre = transforms.decode_options(false, size).channels_last(config.channels_last);
  const int64_t sampled = std::min<int64_t>(kStatisticsImages, train->size());
  const torch::Tensor spread = torch::linspace(0, train->size() - 1, sampled).to(torch::kLong);
  const int64_t statistics_size = std::min(size, kStatisticsSize);
  const auto statistics = data::decode_images(
      train, data::DecodeOptions(centre).size(statistics_size).resize(statistics_size * 256 / 224).channels_last(false));
  const torch::Tensor pixels = (*statistics)(train->get_batch(spread), 0).input;  // in [0, 1]
  for (int64_t c = 0; c < 3; ++c) {
    data.mean.push_back(pixels.select(1, c).mean().item<double>());
    data.std.push_back(divisor(pixels.select(1, c).std().item<double>()));
  }
  data.channels = 3;
  data.image_size = size;
  data.train_transform = data::decode_images(train, data::DecodeOptions(training).mean(data.mean).std(data.std));
  data.evaluation_transform = data::decode_images(evaluated, data::DecodeOptions(centre).mean(data.mean).std(data.std));
  data.transforms = transforms.describe(size);
  data.evaluation_transforms = transforms.describe_evaluation(size);
  return data;
}

// Images held in memory: scaled to [0, 1] and normalised, augmented by --transforms in training.
void augment_stored_images(const TrainConfig& config, TrainingData& data) {
  const data::ImageTransforms transforms = training_transforms(config);
  if (data.features > 0) {
    if (config.augment || !config.transforms.empty()) {
      throw UsageError(config.augment ? "--augment" : "--transforms",
                       "augments images; " + config.data + " holds rows of features");
    }
    return;
  }
  std::vector<data::TransformPtr> chain{data::to_float(1.0 / 255), data::normalize(data.mean, data.std)};
  data.evaluation_transform = data::compose(chain);
  for (data::TransformPtr& step : transforms.stored_transforms(data.image_size)) chain.push_back(std::move(step));
  data.train_transform = data::compose(chain);
  data.transforms = transforms.describe(data.image_size);
}

// The training and evaluation sets of `format` at config.data.
TrainingData load_data_of(const TrainConfig& config, data::DataFormat format) {
  if (decodes_each_epoch(config, format)) return load_each_epoch(config, format);
  TrainingData data;
  data.skipped = skipped_inputs(config);
  const data::SourceOptions source =
      data::SourceOptions().image_size(config.image_size).label_column(config.label_column).skipped(data.skipped);
  data::LabelledDataset train = data::load_images(config.data, format, data::Split::train, source);
  data.train = train.dataset;
  data.classes = train.classes;
  data.evaluated_on = config.validation_split > 0 ? "validation" : "test";
  const data::SourceOptions evaluation_source = data::SourceOptions(source).classes(data.classes);
  if (config.validation_split > 0) {
    std::tie(data.train, data.evaluation) = hold_out(data.train, config.validation_split, config.seed);
  } else if (!config.val_data.empty()) {
    data.evaluation =
        data::load_images(config.val_data, evaluation_format(config, format), data::Split::test, evaluation_source)
            .dataset;
    check_evaluation_set(data, config.val_data);
  } else if (!data::holds_test_split(config.data, format)) {
    no_evaluation_set(config, format);
  } else {
    data.evaluation = data::load_images(config.data, format, data::Split::test, evaluation_source).dataset;
    check_evaluation_set(data, config.data);
  }
  describe_data(*data.train, data);
  augment_stored_images(config, data);
  return data;
}

TrainingData load_data(const TrainConfig& config) {
  const data::DataFormat format = config.data_format == "auto" ? data::detect_data_format(config.data)
                                                               : data::parse_data_format(config.data_format);
  if (config.shuffle == "block-local" && (format != data::DataFormat::pack || config.decode == "once")) {
    throw UsageError("--shuffle", "block-local orders the blocks of a pack read each epoch; " + config.data +
                                      " is read into memory");
  }
  TrainingData data = load_data_of(config, format);
  if (data.format.empty()) data.format = data::data_format_name(format);
  return data;
}

}  // namespace

TrainingData load_training_data(const TrainConfig& config) {
  TrainingData data = load_data(config);
  const std::vector<std::string> skipped = data.skipped ? data.skipped->lines() : std::vector<std::string>{};
  if (!skipped.empty()) {
    fmt::print(stderr, "afterburner: --skip-corrupt left out {} bad input(s) (the report lists them); the first: {}\n",
               skipped.size(), skipped.front());
  }
  return data;
}

struct TrainingSession::Parts {
  TrainConfig config;
  std::string evaluated_on;
  DataSummary data;
  torch::Device device = torch::kCPU;
  int workers = 0;
  torch::nn::Sequential model;  // a zoo model as built: exportable, sharing its parameters with the trained one
  std::optional<sketch::SketchReport> sketch_report;  // of a zoo model built with --sketch
  std::optional<torch::jit::Module> script;  // or the user's TorchScript model, trained in place
  std::unique_ptr<data::Loader> train_loader, test_loader;
  std::string schedule;
  std::unique_ptr<Trainer> trainer;
  int64_t measured_epochs = 0;  // measure_steps() reads fresh epochs from here on
  int64_t rank = 0;

  int threads() const { return config.threads > 0 ? static_cast<int>(config.threads) : available_cores(); }
  Model zoo_model(const TrainConfig& config, const TrainingData& data, const DataParallelism& parallel);
  Model user_model(const TrainConfig& config, const TrainingData& data, const DataParallelism& parallel);
  TrainReport describe(TrainReport report) const;
  void run_steps(const std::function<bool(int64_t)>& next, const std::function<std::optional<double>(int64_t)>& lr,
                 const std::function<void(int64_t, double, int64_t)>& done);
};

// The zoo model as configured, built (and sketched) into `model`; returns the model the trainer
// runs, fused and checkpointed as asked, which shares every parameter with `model`.
Model TrainingSession::Parts::zoo_model(const TrainConfig& config, const TrainingData& data,
                                        const DataParallelism& parallel) {
  if (data.features > 0 && config.model != "mlp") {
    throw UsageError("--model", fmt::format("{} takes images; {} holds rows of {} features: train the mlp (or a "
                                            "model file)", config.model, config.data, data.features));
  }
  model = models::make_model(config.model, models::ModelOptions()
                                               .in_channels(data.channels)
                                               .num_classes(static_cast<int64_t>(data.classes.size()))
                                               .image_size(data.image_size)
                                               .batch_norm(parallel.batch_norm));
  if (config.sketch) {
    auto result = sketched(model, config);
    model = result.model;
    sketch_report = std::move(result.report);
  }
  torch::nn::Sequential trained = model;
  if (config.fuse) {
    auto fused = kernels::fuse(config.sketch ? sketch::fuse_epilogues(model).model : model);
    for (const auto& notice : fused.notices) fmt::print(stderr, "afterburner: {}\n", notice);
    trained = fused.model;
  }
  if (!config.checkpoint_layers.empty()) checkpoint_layers(trained, config.checkpoint_layers);
  return trained;
}

// The user's TorchScript model (config.model names its file), loaded into `script` and checked;
// returns the model the trainer runs: its forward fused where the graph allows (the module
// itself, which is exported, stays as written).
Model TrainingSession::Parts::user_model(const TrainConfig& config, const TrainingData& data,
                                         const DataParallelism& parallel) {
  script = load_user_model(config, data, parallel.replicate != nullptr);
  if (!config.fuse) return Model(*script);
  const kernels::ScriptFuseResult fused = kernels::fuse_forward(*script);
  for (const auto& line : fused.fused) fmt::print(stderr, "afterburner: fused {} in {}\n", line, config.model);
  for (const auto& notice : fused.notices) fmt::print(stderr, "afterburner: {}: {}\n", config.model, notice);
  return Model(*script, fused.forward);
}

TrainingSession::TrainingSession(const TrainConfig& config, const TrainingData& data, const DataParallelism& parallel)
    : parts_(std::make_unique<Parts>()) {
  auto& p = *parts_;
  p.config = config;
  p.evaluated_on = data.evaluated_on;
  const std::vector<int64_t> sample =
      data.features > 0 ? std::vector<int64_t>{data.features}
                        : std::vector<int64_t>{data.channels, data.image_size, data.image_size};
  p.data = {data.format, data.train->size(), data.evaluation->size(), sample, data.classes, data.mean, data.std,
            data.skipped ? data.skipped->lines() : std::vector<std::string>{}, "exact shuffle", data.transforms,
            data.evaluation_transforms};
  ThreadsGuard threads(p.threads());
  p.device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const Precision precision = resolve_precision(config.precision, p.device);
  profile::TensorMemory::install();
  if (config.keep_freed_memory && !keep_freed_memory()) {
    fmt::print(stderr, "afterburner: this C library cannot keep freed memory; --keep-freed-memory has no effect\n");
  }

  torch::manual_seed(config.seed);
  LossFunction loss = config.fuse ? LossFunction(kernels::cross_entropy) : plain_cross_entropy();
  Model trained = is_model_file(config.model) ? p.user_model(config, data, parallel)
                                             : p.zoo_model(config, data, parallel);
  const bool channels_last = config.channels_last && convolves(trained);
  if (channels_last) to_channels_last(trained);
  data::LoaderOptions loader_options;  // not a copy of a temporary: GCC 12 then warns of its optional shard
  loader_options.batch_size(config.batch_size).prefetch(config.prefetch).seed(config.seed).channels_last(channels_last);
  loader_options.block_local(data.block_local);
  std::shared_ptr<Replicas> replicas = parallel.replicate ? parallel.replicate(trained) : nullptr;
  const int64_t rank = p.rank = replicas ? replicas->rank() : 0;
  data::DatasetPtr evaluation = replicas ? shard_for_rank(*replicas, config, loader_options, data.evaluation)
                                         : data.evaluation;
  if (data.block_local) {
    p.data.order = fmt::format("block-local shuffle: {} blocks of 4 MiB at a time, samples shuffled within{}",
                               loader_options.block_window(),
                               replicas ? fmt::format("; rank r of {} takes every {}th sample of it from the r-th",
                                                      replicas->world_size(), replicas->world_size())
                                        : "");
  }
  p.workers = static_cast<int>(config.workers);
  if (p.workers < 0) {
    p.workers = data::choose_workers(data.train, loader_options, data.train_transform);
    fmt::print(stderr, "afterburner: --workers auto chose {} loader worker(s)\n", p.workers);
  }
  loader_options.workers(p.workers);
  p.train_loader = std::make_unique<data::Loader>(data.train, loader_options, data.train_transform);
  p.test_loader = std::make_unique<data::Loader>(
      evaluation,
      data::LoaderOptions(loader_options).batch_size(config.eval_batch_size).shuffle(false).drop_last(false).shard(std::nullopt),
      data.evaluation_transform);
  auto optimizer = make_optimizer(OptimizerOptions()
                                      .kind(config.optimizer)
                                      .lr(config.lr)
                                      .momentum(config.momentum)
                                      .nesterov(config.nesterov && config.momentum > 0)  // without momentum, the same step
                                      .weight_decay(config.weight_decay)
                                      .fused(config.fuse),
                                  trained.parameters());
  const int64_t batches_per_epoch = p.train_loader->batches_per_epoch();
  LrSchedule schedule(ScheduleOptions().kind(config.schedule).warmup_steps(config.warmup_steps), config.lr,
                      total_steps(config, batches_per_epoch));
  p.schedule = schedule.describe();

  std::string checkpoint;
  if (!config.checkpoint_dir.empty()) {
    std::filesystem::create_directories(config.checkpoint_dir);
    checkpoint = checkpoint_file(config.checkpoint_dir);
  }
  p.trainer = std::make_unique<Trainer>(trained, std::move(optimizer), schedule, *p.train_loader, *p.test_loader,
                                        TrainerOptions()
                                            .model_name(config.model)
                                            .epochs(config.epochs)
                                            .loss(loss)
                                            .precision(precision)
                                            .accumulate(config.accumulate)
                                            .clip_grad_norm(config.clip_grad_norm)
                                            .clip_grad_value(config.clip_grad_value)
                                            .checkpoint_path(checkpoint)
                                            .checkpoint_every(config.checkpoint_every)
                                            .target_accuracy(config.target_accuracy)
                                            .eval_every(evaluation_interval(config, batches_per_epoch))
                                            .max_steps(config.max_steps)
                                            .skip_nonfinite(config.skip_nonfinite)
                                            .bf16_weights(config.bf16_weights)
                                            .device(p.device)
                                            .replicas(replicas));
  if (const Bf16Weights* weights = p.trainer->bf16_weights()) {
    fmt::print(stderr, "afterburner: {} weights of {} read from bf16 copies in training (fp32 masters stepped)\n",
               weights->size(), config.model);
  }
  auto progress = parse_progress_mode(config.progress);
  if (progress != ProgressMode::none && rank == 0) p.trainer->add_callback(std::make_shared<ProgressBar>(progress));
  if (!config.log_jsonl.empty() && rank == 0) p.trainer->add_callback(std::make_shared<JsonlLog>(config.log_jsonl));
  if (config.early_stopping > 0) p.trainer->add_callback(std::make_shared<EarlyStopping>(config.early_stopping));
  if (config.profile_steps > 0 && rank == 0) {
    p.trainer->add_callback(std::make_shared<ProfileSteps>(/*warmup=*/5, config.profile_steps, config.trace));
  }
}

TrainingSession::~TrainingSession() = default;

const TrainConfig& TrainingSession::config() const { return parts_->config; }

int64_t TrainingSession::rank() const { return parts_->rank; }

namespace {

// What the exported model's outputs and input are (infer/model_file.h, kMetadataFile): the
// classes its logits index, and the normalisation its training batches had.
std::string export_metadata(const DataSummary& data) {
  const bool table = data.sample.size() == 1;
  nlohmann::json metadata = {
      {"classes", data.classes},
      {"input",
       {{"shape", data.sample},
        {"dtype", "float32"},
        {"scale", table ? 1.0 : 1.0 / 255},
        {"mean", data.mean},
        {"std", data.std},
        {"normalisation", table ? "(value - mean[f]) / std[f] for each feature f"
                                : "(pixel * scale - mean[c]) / std[c] for each channel c of uint8 pixels"}}},
      {"data", data.format}};
  if (!table) {  // what turns an image into the evaluation set's: a served image (serve/image_input.h)
    const int64_t size = data.sample.back();
    metadata["input"]["transforms"] = data.evaluation_transforms.empty()
                                          ? fmt::format("resize{},centre{}", size, size)
                                          : data.evaluation_transforms;
  }
  return metadata.dump(2);
}

}  // namespace

const sketch::SketchReport* TrainingSession::sketch_report() const {
  return parts_->sketch_report ? &*parts_->sketch_report : nullptr;
}

void TrainingSession::export_model(const std::string& path) const {
  const std::string metadata = export_metadata(parts_->data);
  if (parts_->script) {
    // In evaluation mode, as the zoo's exports: torch.jit.load gives a model ready to predict.
    torch::jit::Module& script = *parts_->script;
    const bool training = script.is_training();
    script.eval();
    infer::save_model(script, path, metadata);
    script.train(training);
  } else {
    models::export_torchscript(parts_->model, path, {{infer::kMetadataFile, metadata}});
  }
}

TrainReport TrainingSession::fit() {
  auto& p = *parts_;
  ThreadsGuard threads(p.threads());
  if (p.config.resume) p.trainer->resume();
  try {
    return p.describe(p.trainer->fit());
  } catch (const TrainingFailure& failure) {
    throw TrainingFailure(p.describe(failure.report()));
  }
}

// The trainer's report with the session's own facts: the options, model, schedule, threads.
TrainReport TrainingSession::Parts::describe(TrainReport report) const {
  for (const auto& field : config_fields()) report.config[field.name] = field.get(config);
  report.model = config.model;
  report.schedule = schedule;
  report.evaluated_on = evaluated_on;
  report.data = data;
  report.batch_size = config.batch_size;
  report.threads = at::get_num_threads();
  report.workers = workers;
  for (const auto& parameter : trainer->model().parameters()) report.trainable_parameters += parameter.numel();
  return report;
}

void TrainingSession::add_callback(CallbackPtr callback) { parts_->trainer->add_callback(std::move(callback)); }

// Optimizer steps over fresh epochs of the training loader until `next` returns false: `next(i)`
// is asked before step i's first micro-batch, `lr(i)` gives its learning rate (nullopt: the
// schedule's) and `done(i, loss, samples)` gets its mean loss; a loss that is not finite ends
// the steps before the optimizer takes it.
void TrainingSession::Parts::run_steps(const std::function<bool(int64_t)>& next,
                                       const std::function<std::optional<double>(int64_t)>& lr,
                                       const std::function<void(int64_t, double, int64_t)>& done) {
  ThreadsGuard threads_guard(threads());
  int64_t step = 0, micro = 0, samples = 0;
  double loss_sum = 0;
  if (!next(step)) return;
  for (;; ++measured_epochs) {
    for (auto& batch : data::Prefetcher(train_loader->epoch(measured_epochs), device)) {
      double loss = trainer->forward_backward(batch);
      if (!std::isfinite(loss)) {
        ++measured_epochs;
        return done(step, loss, batch.target.size(0));
      }
      loss_sum += loss;
      samples += batch.target.size(0);
      if (++micro % config.accumulate != 0) continue;
      trainer->optimizer_step(lr(step));
      done(step, loss_sum / double(config.accumulate), samples);
      loss_sum = 0;
      samples = 0;
      if (!next(++step)) {
        ++measured_epochs;
        return;
      }
    }
  }
}

StepMeasurement TrainingSession::measure_steps(int64_t warmup, int64_t steps) {
  StepMeasurement measured;
  measured.steps = steps;
  auto start = std::chrono::steady_clock::now();
  parts_->run_steps(
      [&](int64_t step) {
        if (step == warmup) {
          profile::TensorMemory::reset_peak();
          start = std::chrono::steady_clock::now();
        }
        return step < warmup + steps;
      },
      [](int64_t) { return std::nullopt; },
      [&](int64_t step, double loss, int64_t samples) {
        measured.samples += step >= warmup ? samples : 0;
        measured.diverged = measured.diverged || !std::isfinite(loss);
      });
  measured.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  measured.samples_per_sec = measured.seconds > 0 ? double(measured.samples) / measured.seconds : 0;
  measured.peak_tensor_mb = double(profile::TensorMemory::peak_bytes()) / (1 << 20);
  return measured;
}

std::vector<double> TrainingSession::losses_at(const std::vector<double>& lrs) {
  std::vector<double> losses;
  parts_->run_steps([&](int64_t step) { return step < int64_t(lrs.size()); },
                    [&](int64_t step) { return std::optional<double>(lrs[step]); },
                    [&](int64_t, double loss, int64_t) { losses.push_back(loss); });
  return losses;
}

}  // namespace afterburner::train
