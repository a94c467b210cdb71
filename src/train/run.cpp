#include "afterburner/train/run.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/threads.h"
#include "afterburner/data/idx.h"
#include "afterburner/data/loader.h"
#include "afterburner/data/transforms.h"
#include "afterburner/kernels/cross_entropy.h"
#include "afterburner/kernels/fuse.h"
#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "afterburner/profile/memory.h"
#include "afterburner/sketch/sequential.h"
#include "afterburner/train/checkpointed.h"
#include "afterburner/train/profile_steps.h"
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

struct ImageStatistics {
  int64_t channels = 0, size = 0;
  std::vector<double> mean, std;  // per channel, of the images scaled to [0, 1]
};

// Exact statistics of uint8 images from each channel's histogram of the 256 pixel values,
// without a floating-point copy of the whole set.
ImageStatistics describe_images(const data::Dataset& dataset) {
  auto all = dataset.get_batch(torch::arange(dataset.size())).input;
  if (all.scalar_type() != torch::kByte || all.dim() != 4 || all.size(2) != all.size(3)) {
    throw UsageError("--data", "expected square uint8 images [N, C, H, W]");
  }
  ImageStatistics stats{all.size(1), all.size(2), {}, {}};
  auto levels = torch::arange(256, torch::kDouble).div_(255.0);
  for (int64_t c = 0; c < stats.channels; ++c) {
    auto counts = torch::bincount(all.select(1, c).flatten(), {}, 256).to(torch::kDouble);
    double n = counts.sum().item<double>();
    double mean = (counts * levels).sum().item<double>() / n;
    double var = (counts * (levels - mean).square()).sum().item<double>() / (n - 1);
    stats.mean.push_back(mean);
    stats.std.push_back(std::sqrt(var));
  }
  return stats;
}

void to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
}

int64_t total_steps(const TrainConfig& config, int64_t batches_per_epoch) {
  int64_t per_epoch = (batches_per_epoch + config.accumulate - 1) / config.accumulate;
  int64_t steps = per_epoch * config.epochs;
  return config.max_steps > 0 ? std::min(steps, config.max_steps) : steps;
}

// Fails before a long run rather than after it when an output cannot be written.
void check_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  auto dir = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(dir)) throw Error(path + " (" + flag + "): its directory does not exist");
  if (::access(dir.c_str(), W_OK) != 0) throw Error(path + " (" + flag + "): its directory is not writable");
}

void write_report(const TrainReport& report, const std::string& path) {
  write_file_atomically(path, report.to_json().dump(2) + '\n');
}

torch::nn::Sequential sketched(const torch::nn::Sequential& model, const TrainConfig& config) {
  auto result = sketch::sketch_sequential(model, sketch::SketchConfig()
                                                     .terms(config.sketch_terms)
                                                     .rank(config.sketch_rank)
                                                     .budget(config.sketch_rank > 0 ? 0.0 : config.sketch_budget));
  for (const auto& layer : result.report.layers) fmt::print(stderr, "afterburner: sketch: {}\n", sketch::describe(layer));
  fmt::print(stderr, "afterburner: sketch: {}\n", sketch::describe(result.report));
  return result.model;
}

}  // namespace

std::string checkpoint_file(const std::string& checkpoint_dir) {
  return (std::filesystem::path(checkpoint_dir) / "checkpoint.pt").string();
}

TrainReport run_training(const TrainConfig& config) {
  validate(config);
  for (const auto& [path, flag] : {std::pair{config.report, "--report"}, {config.export_path, "--export"},
                                   {config.log_jsonl, "--log-jsonl"}, {config.trace, "--trace"}}) {
    check_writable(path, flag);
  }
  ThreadsGuard threads(config.threads > 0 ? static_cast<int>(config.threads) : available_cores());
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const Precision precision = resolve_precision(config.precision, device);
  profile::TensorMemory::install();
  if (config.keep_freed_memory && !keep_freed_memory()) {
    fmt::print(stderr, "afterburner: this C library cannot keep freed memory; --keep-freed-memory has no effect\n");
  }
  torch::manual_seed(config.seed);

  // Labels outside the model's outputs stop the run here, naming the file, not inside the loss.
  auto model_options = models::ModelOptions();
  auto train_set = data::load_mnist(config.data, data::Split::train, model_options.num_classes());
  auto test_set = data::load_mnist(config.data, data::Split::test, model_options.num_classes());
  auto norm = describe_images(*train_set);
  std::vector<data::TransformPtr> train_chain{data::to_float(1.0 / 255), data::normalize(norm.mean, norm.std)};
  if (config.augment) train_chain.push_back(data::random_crop(2));
  auto test_chain = data::compose({data::to_float(1.0 / 255), data::normalize(norm.mean, norm.std)});

  auto model = models::make_model(config.model, model_options.in_channels(norm.channels).image_size(norm.size));
  if (config.sketch) model = sketched(model, config);
  bool channels_last = config.channels_last && config.model != "mlp";
  auto loader_options = data::LoaderOptions()
                            .batch_size(config.batch_size)
                            .prefetch(config.prefetch)
                            .seed(config.seed)
                            .channels_last(channels_last);
  int workers = static_cast<int>(config.workers);
  if (workers < 0) {
    workers = data::choose_workers(train_set, loader_options, data::compose(train_chain));
    fmt::print(stderr, "afterburner: --workers auto chose {} loader worker(s)\n", workers);
  }
  loader_options.workers(workers);
  data::Loader train_loader(train_set, loader_options, data::compose(train_chain));
  data::Loader test_loader(test_set,
                           data::LoaderOptions(loader_options).batch_size(config.eval_batch_size).shuffle(false).drop_last(false),
                           test_chain);

  // The trainer runs `trained`; `model` shares every parameter and stays exportable.
  torch::nn::Sequential trained = model;
  LossFunction loss = plain_cross_entropy();
  if (config.fuse) {
    auto fused = kernels::fuse(model);
    for (const auto& notice : fused.notices) fmt::print(stderr, "afterburner: {}\n", notice);
    trained = fused.model;
    loss = kernels::cross_entropy;
  }
  if (!config.checkpoint_layers.empty()) checkpoint_layers(trained, config.checkpoint_layers);
  if (channels_last) to_channels_last(*model);
  auto optimizer = make_optimizer(OptimizerOptions()
                                      .kind(config.optimizer)
                                      .lr(config.lr)
                                      .momentum(config.momentum)
                                      .nesterov(config.nesterov)
                                      .weight_decay(config.weight_decay)
                                      .fused(config.fuse),
                                  trained->parameters());
  LrSchedule schedule(ScheduleOptions().kind(config.schedule).warmup_steps(config.warmup_steps), config.lr,
                      total_steps(config, train_loader.batches_per_epoch()));

  std::string checkpoint;
  if (!config.checkpoint_dir.empty()) {
    std::filesystem::create_directories(config.checkpoint_dir);
    checkpoint = checkpoint_file(config.checkpoint_dir);
  }
  Trainer trainer(trained, std::move(optimizer), schedule, train_loader, test_loader,
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
                      .eval_every(config.eval_every)
                      .max_steps(config.max_steps)
                      .skip_nonfinite(config.skip_nonfinite)
                      .device(device));
  auto progress = parse_progress_mode(config.progress);
  if (progress != ProgressMode::none) trainer.add_callback(std::make_shared<ProgressBar>(progress));
  if (!config.log_jsonl.empty()) trainer.add_callback(std::make_shared<JsonlLog>(config.log_jsonl));
  if (config.early_stopping > 0) trainer.add_callback(std::make_shared<EarlyStopping>(config.early_stopping));
  if (config.profile_steps > 0) {
    trainer.add_callback(std::make_shared<ProfileSteps>(/*warmup=*/5, config.profile_steps, config.trace));
  }
  if (config.resume) trainer.resume();

  TrainReport report = trainer.fit();
  report.model = config.model;
  report.batch_size = config.batch_size;
  report.threads = at::get_num_threads();
  report.workers = workers;
  for (const auto& p : model->parameters()) report.trainable_parameters += p.numel();
  if (!config.export_path.empty()) models::export_torchscript(model, config.export_path);
  if (!config.report.empty()) write_report(report, config.report);
  return report;
}

}  // namespace afterburner::train
