#include "afterburner/train/config.h"

#include <fmt/format.h>

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "afterburner/core/error.h"
#include "afterburner/monitor/dashboard.h"
#include "afterburner/sketch/plan.h"

namespace afterburner::train {
namespace {

std::string flag_name(const std::string& name) {
  std::string flag = name;
  for (auto& c : flag) c = c == '_' ? '-' : c;
  return "--" + flag;
}

int64_t parse_int(const std::string& field, const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw UsageError(field, "expected an integer, got '" + text + "'");
  }
  return value;
}

double parse_double(const std::string& field, const std::string& text) {
  std::istringstream in(text);
  double value = 0;
  in >> value;
  if (!in || !in.eof()) throw UsageError(field, "expected a number, got '" + text + "'");
  return value;
}

bool parse_bool(const std::string& field, const std::string& text) {
  if (text == "true" || text == "1" || text == "on" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "off" || text == "no") return false;
  throw UsageError(field, "expected true or false, got '" + text + "'");
}

std::string format_double(double v) { return fmt::format("{}", v); }

template <typename T>
using Member = T TrainConfig::*;

// Field factories: one per value type, each with an optional check of the parsed value.
ConfigField integer(std::string name, std::string help, Member<int64_t> member, int64_t min) {
  auto field = flag_name(name);
  return {name, help, false, "INT",
          [=](TrainConfig& c, const std::string& text) {
            int64_t v = parse_int(field, text);
            if (v < min) throw UsageError(field, fmt::format("must be at least {}, got {}", min, v));
            c.*member = v;
          },
          [=](const TrainConfig& c) { return std::to_string(c.*member); }};
}

ConfigField number(std::string name, std::string help, Member<double> member, double min, double max) {
  auto field = flag_name(name);
  return {name, help, false, "FLOAT",
          [=](TrainConfig& c, const std::string& text) {
            double v = parse_double(field, text);
            if (!(v >= min && v <= max)) {
              throw UsageError(field, fmt::format("must be in [{}, {}], got {}", min, max, text));
            }
            c.*member = v;
          },
          [=](const TrainConfig& c) { return format_double(c.*member); }};
}

ConfigField text(std::string name, std::string help, Member<std::string> member,
                 std::vector<std::string> choices = {}) {
  auto field = flag_name(name);
  return {name, help, false, "TEXT",
          [=](TrainConfig& c, const std::string& value) {
            if (!choices.empty() && std::find(choices.begin(), choices.end(), value) == choices.end()) {
              throw UsageError(field, fmt::format("must be one of {}, got '{}'", fmt::join(choices, ", "), value));
            }
            c.*member = value;
          },
          [=](const TrainConfig& c) { return c.*member; }};
}

ConfigField path(std::string name, std::string help, Member<std::string> member) {
  ConfigField field = text(std::move(name), std::move(help), member);
  field.type = "PATH";
  return field;
}

ConfigField flag(std::string name, std::string help, Member<bool> member) {
  auto field = flag_name(name);
  return {name, help, true, "BOOL",
          [=](TrainConfig& c, const std::string& value) { c.*member = parse_bool(field, value); },
          [=](const TrainConfig& c) { return std::string(c.*member ? "true" : "false"); }};
}

ConfigField workers_field() {
  return {"workers", "loader threads, or auto to measure and pick the fastest", false, "INT|auto",
          [](TrainConfig& c, const std::string& value) {
            if (value == "auto") {
              c.workers = -1;
              return;
            }
            int64_t n = parse_int("--workers", value);
            if (n < 0) throw UsageError("--workers", "must be auto or at least 0, got " + value);
            c.workers = n;
          },
          [](const TrainConfig& c) { return c.workers < 0 ? std::string("auto") : std::to_string(c.workers); }};
}

ConfigField dashboard_field() {
  return {"dashboard",
          "serve the run's live dashboard at http://[HOST:]PORT/dashboard (HOST 127.0.0.1 unless given, PORT 0: any "
          "free one)",
          false, "[HOST:]PORT",
          [](TrainConfig& c, const std::string& value) {
            if (!value.empty()) monitor::parse_listen_address(value, "--dashboard");
            c.dashboard = value;
          },
          [](const TrainConfig& c) { return c.dashboard; }};
}

ConfigField seed_field() {
  return {"seed", "seed for initialisation, shuffling and augmentation", false, "INT",
          [](TrainConfig& c, const std::string& value) {
            int64_t n = parse_int("--seed", value);
            if (n < 0) throw UsageError("--seed", "must not be negative");
            c.seed = static_cast<uint64_t>(n);
          },
          [](const TrainConfig& c) { return std::to_string(c.seed); }};
}

ConfigField sketch_layers_field() {
  return {"sketch_layers",
          "per-layer sketches overriding --sketch-rank/--sketch-budget: NAME=L:k or NAME=keep, comma-separated "
          "(names as the sketch report prints them)",
          false, "NAME=L:k,...",
          [](TrainConfig& c, const std::string& value) {
            sketch::parse_layer_sketches(value, "--sketch-layers");
            c.sketch_layers = value;
          },
          [](const TrainConfig& c) { return c.sketch_layers; }};
}

ConfigField layer_list_field() {
  return {"checkpoint_layers", "comma-separated layer indices to run with activation checkpointing", false, "INT,...",
          [](TrainConfig& c, const std::string& value) {
            c.checkpoint_layers.clear();
            std::stringstream in(value);
            std::string item;
            while (std::getline(in, item, ',')) {
              if (!item.empty()) c.checkpoint_layers.push_back(parse_int("--checkpoint-layers", item));
            }
          },
          [](const TrainConfig& c) { return fmt::format("{}", fmt::join(c.checkpoint_layers, ",")); }};
}

std::vector<ConfigField> make_fields() {
  const double inf = std::numeric_limits<double>::infinity();
  return {
      text("model", "model from the zoo (mlp, cnn, resnet) or a TorchScript file to train in place (my_model.pt)",
           &TrainConfig::model),
      path("data",
           "the training images: a folder of MNIST-format IDX files, of class folders of JPEG/PNG images (with "
           "train/ and val/ inside, or one set), of CIFAR-10/100 binary batches, of x_train.npy and its kin, or of "
           "a *train.csv and a *test.csv; an .npz archive; a CSV file (one set; pixel rows of a square count are "
           "grayscale images, other rows features)",
           &TrainConfig::data),
      text("data_format", "auto (told by what --data holds), idx, folder, cifar, npy, csv or pack",
           &TrainConfig::data_format, {"auto", "idx", "folder", "cifar", "npy", "csv", "pack"}),
      text("label_column",
           "a CSV file's label column, by header name or index (default: the column named label, target, class "
           "or y, else the last)",
           &TrainConfig::label_column),
      text("shuffle",
           "the training order: exact (a full shuffle), block-local (a pack's 4 MiB blocks in random order, a "
           "window of 16 at a time, samples shuffled within: FFCV's quasi-random order for data larger than "
           "memory) or auto (block-local for a pack larger than half the available memory)",
           &TrainConfig::shuffle, {"auto", "exact", "block-local"}),
      flag("skip_corrupt",
           "skip corrupt or unreadable images, empty class folders, bad CSV rows and evaluation samples whose label "
           "is not a training class, instead of stopping at the first (the report lists them)",
           &TrainConfig::skip_corrupt),
      path("val_data", "evaluate on this dataset (its test split, or its class folders) instead of --data's",
           &TrainConfig::val_data),
      integer("image_size",
              "resize image folders' images (shorter side, antialiased) and centre-crop them to this square (0 = as "
              "stored, one square size)",
              &TrainConfig::image_size, 0),
      text("decode",
           "image folders and packs: once (every image decoded into memory at --image-size) or each-epoch (decoded "
           "by the loader's workers every epoch with --transforms, RandomResizedCrop and a horizontal flip unless "
           "given, as torchvision's ImageNet training; evaluation on the centre crop; --image-size 224 unless given); "
           "auto: each-epoch for packs, and for folders whose --transforms crop or resize, else once",
           &TrainConfig::decode, {"auto", "once", "each-epoch"}),
      text("transforms",
           "the training images' augmentation, a list of rrcS[:MIN] (RandomResizedCrop), resizeR (the shorter side), "
           "cropS (RandomCrop), centreS (CenterCrop), padP (zeros around, before crop) and flip[:P]: "
           "rrc224,flip or resize256,crop224,flip for images decoded each epoch (evaluation: the centre crop of the "
           "same resize), pad4,crop,flip for images held in memory (default: rrc,flip decoded each epoch, else none)",
           &TrainConfig::transforms),
      integer("epochs", "passes over the training set", &TrainConfig::epochs, 1),
      integer("batch_size", "samples per micro-batch, over all data-parallel ranks together", &TrainConfig::batch_size, 1),
      integer("eval_batch_size", "samples per evaluation batch", &TrainConfig::eval_batch_size, 1),
      number("lr", "peak learning rate", &TrainConfig::lr, 1e-12, inf),
      text("optimizer", "sgd or adamw", &TrainConfig::optimizer, {"sgd", "adamw"}),
      number("momentum", "SGD momentum", &TrainConfig::momentum, 0, 1),
      flag("nesterov", "Nesterov momentum for SGD (no effect with --momentum 0)", &TrainConfig::nesterov),
      number("weight_decay", "weight decay (decoupled for adamw)", &TrainConfig::weight_decay, 0, inf),
      text("schedule", "learning-rate schedule: constant, cosine, onecycle, step", &TrainConfig::schedule,
           {"constant", "cosine", "onecycle", "step"}),
      integer("warmup_steps", "linear warm-up steps of the cosine schedule (a run no longer is all warm-up)",
              &TrainConfig::warmup_steps, 0),
      text("precision", "auto, fp32, bf16 or fp16 (auto = bf16 where the CPU has it natively)",
           &TrainConfig::precision, {"auto", "fp32", "bf16", "fp16"}),
      workers_field(),
      integer("prefetch", "batches each loader worker prepares ahead", &TrainConfig::prefetch, 1),
      integer("accumulate", "micro-batches per optimizer step (gradient accumulation)", &TrainConfig::accumulate, 1),
      number("clip_grad_norm", "clip the global gradient norm to this (0 = off)", &TrainConfig::clip_grad_norm, 0, inf),
      number("clip_grad_value", "clip each gradient entry to +-this (0 = off)", &TrainConfig::clip_grad_value, 0, inf),
      flag("augment", "random crop with 2 pixels of padding on training batches (--transforms pad2,crop)",
           &TrainConfig::augment),
      flag("fuse", "fused training ops (ReLU+max-pool, Linear+ReLU, Conv2d+ReLU, cross-entropy, flat optimizer)", &TrainConfig::fuse),
      flag("channels_last", "keep image batches and conv weights channels_last (models with convolutions only)",
           &TrainConfig::channels_last),
      flag("keep_freed_memory", "keep freed memory in the process for the next step instead of returning it to the OS",
           &TrainConfig::keep_freed_memory),
      flag("bf16_weights",
           "in bf16 training of a model file, keep its convolution and linear weights in bf16 for the forward, their "
           "fp32 masters stepped by the fused optimizer (the same bits as autocast's casts, without them)",
           &TrainConfig::bf16_weights),
      flag("sketch", "replace Linear and Conv2d layers by sketched ones (SKLinear, SKConv2d) where the sketch costs less",
           &TrainConfig::sketch),
      integer("sketch_terms", "sketched terms per layer (L)", &TrainConfig::sketch_terms, 1),
      integer("sketch_rank", "rank of each sketched term (k); 0 = the largest within --sketch-budget",
              &TrainConfig::sketch_rank, 0),
      number("sketch_budget", "fraction of each layer's weights its sketch may use, when --sketch-rank is 0",
             &TrainConfig::sketch_budget, 1e-9, 1 - 1e-9),
      sketch_layers_field(),
      layer_list_field(),
      path("checkpoint_dir", "directory for checkpoints (empty = none)", &TrainConfig::checkpoint_dir),
      integer("checkpoint_every", "also checkpoint every N optimizer steps (0 = epoch ends only)",
              &TrainConfig::checkpoint_every, 0),
      flag("resume", "continue from the checkpoint in --checkpoint-dir", &TrainConfig::resume),
      seed_field(),
      integer("threads", "intra-op threads (0 = all cores)", &TrainConfig::threads, 0),
      path("report", "write the final report to this file: JSON, or with .html the dashboard page with the run inside",
           &TrainConfig::report),
      dashboard_field(),
      path("log_jsonl", "write one JSON line per step and per evaluation to this file", &TrainConfig::log_jsonl),
      path("export", "write the trained model as TorchScript to this file", &TrainConfig::export_path),
      number("target_accuracy", "stop once test accuracy reaches this (0 = off)", &TrainConfig::target_accuracy, 0, 1),
      number("validation_split",
             "fraction of the training set held out and evaluated instead of the test set (0 = the test set)",
             &TrainConfig::validation_split, 0, 0.5),
      integer("eval_every",
              "also evaluate every N optimizer steps (0 = auto: 8 times an epoch with --target-accuracy, else at "
              "epoch ends only)",
              &TrainConfig::eval_every, 0),
      integer("max_steps", "stop after N optimizer steps (0 = no limit)", &TrainConfig::max_steps, 0),
      integer("early_stopping", "stop after N evaluations without a better accuracy (0 = off)",
              &TrainConfig::early_stopping, 0),
      flag("skip_nonfinite", "skip steps whose loss is inf/NaN instead of stopping", &TrainConfig::skip_nonfinite),
      text("progress", "auto, bar, log or none", &TrainConfig::progress, {"auto", "bar", "log", "none"}),
      integer("profile", "profile this many steps and print the op table (0 = off)",
              &TrainConfig::profile_steps, 0),
      path("trace", "Chrome trace JSON of the profiled steps", &TrainConfig::trace),
      integer("nproc", "data-parallel ranks on this machine, each on its share of the cores", &TrainConfig::nproc, 1),
      integer("nnodes", "machines in a data-parallel job", &TrainConfig::nnodes, 1),
      integer("node_rank", "this machine's index in the job (0 to --nnodes - 1)", &TrainConfig::node_rank, 0),
      text("master_addr", "address of the machine of rank 0, which serves the rendezvous", &TrainConfig::master_addr),
      integer("master_port", "rendezvous port (0 = a free one on one machine, 29500 across machines)",
              &TrainConfig::master_port, 0),
      number("dist_timeout", "seconds a rank waits for the others (rendezvous, each collective) before failing",
             &TrainConfig::dist_timeout, 1, 86400),
  };
}

std::string toml_value_text(const toml::node& node, const std::string& where) {
  if (auto s = node.as_string()) return s->get();
  if (auto i = node.as_integer()) return std::to_string(i->get());
  if (auto f = node.as_floating_point()) return format_double(f->get());
  if (auto b = node.as_boolean()) return b->get() ? "true" : "false";
  if (auto a = node.as_array()) {
    std::vector<std::string> items;
    for (const auto& item : *a) items.push_back(toml_value_text(item, where));
    return fmt::format("{}", fmt::join(items, ","));
  }
  throw UsageError(where, "unsupported TOML value type");
}

}  // namespace

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = make_fields();
  return fields;
}

void set_field(TrainConfig& config, const std::string& name, const std::string& value) {
  for (const auto& field : config_fields()) {
    if (field.name == name) {
      field.set(config, value);
      return;
    }
  }
  throw UsageError(name, "unknown option");
}

void apply_toml_file(TrainConfig& config, const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) throw UsageError(path, "no such config file");
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw UsageError(fmt::format("{}:{}:{}", path, where.line, where.column), std::string(e.description()));
  }
  for (const auto& [key, node] : table) {
    std::string name(key.str());
    std::string where = path + ": " + name;
    bool known = false;
    for (const auto& field : config_fields()) known |= field.name == name;
    if (!known) throw UsageError(where, "unknown key");
    try {
      set_field(config, name, toml_value_text(node, where));
    } catch (const UsageError& e) {
      throw UsageError(where, e.problem());  // the file's key, not the flag
    }
  }
}

namespace {

// A field's text as a TOML value: booleans and numbers bare, everything else a quoted string.
// Either way apply_toml_file() hands the same text back to the field's parser.
std::string toml_value(const std::string& text) {
  if (text == "true" || text == "false") return text;
  double number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (!text.empty() && ec == std::errc() && end == text.data() + text.size() && std::isfinite(number)) return text;
  std::ostringstream out;
  out << toml::value<std::string>(text);
  return out.str();
}

}  // namespace

std::string to_toml(const TrainConfig& config, const TrainConfig* relative_to) {
  std::string text;
  for (const auto& field : config_fields()) {
    auto value = field.get(config);
    if (relative_to && value == field.get(*relative_to)) continue;
    text += field.name + " = " + toml_value(value) + "\n";
  }
  return text;
}

void validate(const TrainConfig& config) {
  if (config.resume && config.checkpoint_dir.empty()) {
    throw UsageError("--resume", "needs --checkpoint-dir to resume from");
  }
  if (config.trace.size() && config.profile_steps == 0) {
    throw UsageError("--trace", "needs --profile N");
  }
  const TrainConfig defaults;
  for (auto [flag, changed] : {std::pair<const char*, bool>{"--sketch-terms", config.sketch_terms != defaults.sketch_terms},
                               {"--sketch-rank", config.sketch_rank != defaults.sketch_rank},
                               {"--sketch-budget", config.sketch_budget != defaults.sketch_budget},
                               {"--sketch-layers", !config.sketch_layers.empty()}}) {
    if (changed && !config.sketch) throw UsageError(flag, "needs --sketch");
  }
  const int64_t ranks = config.nproc * config.nnodes;
  if (config.batch_size % ranks != 0) {
    throw UsageError("--batch-size", fmt::format("must divide evenly over the {} ranks, got {}", ranks, config.batch_size));
  }
  if (config.node_rank >= config.nnodes) {
    throw UsageError("--node-rank", fmt::format("must be below --nnodes {}, got {}", config.nnodes, config.node_rank));
  }
  if (config.master_port > 65535) {
    throw UsageError("--master-port", fmt::format("must be at most 65535, got {}", config.master_port));
  }
}

}  // namespace afterburner::train
