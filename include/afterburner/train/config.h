// TrainConfig: every option of a training run, in one struct that travels from the command
// line or a TOML file down to the Trainer. Each field is described once, in config_fields(),
// which both the TOML reader and the CLI use: names, help, parsing and validation agree.
//
//   TrainConfig config;                                   // the documented defaults
//   apply_toml_file(config, "run.toml");                  // batch_size = 256, lr = 0.1, ...
//   set_field(config, "precision", "fp32");               // e.g. from a flag
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace afterburner::train {

struct TrainConfig {
  std::string model = "cnn";
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string data_format = "auto";  // data/sources.h: auto, idx, folder, cifar, npy, csv, pack
  std::string val_data;              // a separate evaluation set (empty: --data's test split)
  std::string label_column;          // a CSV file's label column, by name or index (empty: data/csv.h's choice)
  bool skip_corrupt = false;         // skip (and report) corrupt images, bad CSV rows, labels outside the classes
  std::string shuffle = "auto";      // exact, block-local (packs: a few 4 MiB blocks at a time) or auto
  int64_t image_size = 0;            // image folders resized and cropped to this square (0 = as stored; 224 each epoch)
  std::string decode = "auto";       // "once" into memory, "each-epoch" with random crops; auto: each-epoch for packs
  // Training images' augmentation, a list (data/image_transforms.h): "rrc224,flip", "pad4,crop,flip"; empty:
  // rrc,flip for images decoded each epoch, none (or --augment's pad2,crop) for images in memory.
  std::string transforms;
  // The default recipe reaches 91% on Fashion-MNIST's cnn in the fewest samples measured
  // (docs/time-to-accuracy.md): no augmentation, Nesterov SGD at 0.1, cosine over 3 epochs.
  int64_t epochs = 3;
  int64_t batch_size = 128;        // over all data-parallel ranks: each of N takes batch_size / N
  int64_t eval_batch_size = 128;   // 1000 was 4x slower: its activations spill the caches
  double lr = 0.1;
  std::string optimizer = "sgd";
  double momentum = 0.9;
  bool nesterov = true;
  double weight_decay = 5e-4;
  std::string schedule = "cosine";
  int64_t warmup_steps = 100;
  std::string precision = "auto";  // auto = bf16 where the CPU computes it natively, else fp32
  // -1 = auto (measure and pick). 0: batches prepared between steps. A worker thread prepares them
  // during the step instead, but on a machine whose cores the intra-op threads all take it
  // preempts one of them at every parallel region: on 2 cores one worker made the zoo cnn 0.88x
  // in bf16 (0.97x fp32, within noise; BENCHMARKS.md, Ablation).
  int64_t workers = 0;
  int64_t prefetch = 4;
  int64_t accumulate = 1;
  double clip_grad_norm = 0;       // 0 = off
  double clip_grad_value = 0;      // 0 = off
  bool augment = false;            // --transforms pad2,crop: slower to 91% in 3 epochs
  bool fuse = true;                // afterburner's fused ops, loss and optimizer step
  // For models that convolve (a 4-D parameter): oneDNN's NHWC kernels, where NCHW tensors are
  // reordered to blocked layouts at every convolution (the zoo cnn 1.11x in bf16, within noise in
  // fp32; with no loader worker, torchvision's MobileNetV3-Small went from 0.30x to 1.26x of
  // Python's best practice: BENCHMARKS.md).
  bool channels_last = true;
  bool keep_freed_memory = true;   // core/heap.h
  bool bf16_weights = true;        // bf16 copies of a model file's conv/linear weights (train/bf16_weights.h)
  bool sketch = false;             // replace Linear/Conv2d layers by sketched ones (sketch/sequential.h)
  int64_t sketch_terms = 1;        // L
  int64_t sketch_rank = 0;         // k; 0 = the largest within sketch_budget
  double sketch_budget = 0.25;     // fraction of each layer's weights its sketch may use
  std::string sketch_layers;       // per-layer overrides, "fc1=2:32,fc2=keep" (sketch::parse_layer_sketches)
  std::vector<int64_t> checkpoint_layers;  // activation checkpointing of these layer indices
  std::string checkpoint_dir;      // empty = no checkpoints
  int64_t checkpoint_every = 0;    // steps; 0 = at epoch ends only
  bool resume = false;
  uint64_t seed = 0;
  int64_t threads = 0;             // 0 = LibTorch's default (all cores)
  std::string report;              // report path: JSON, or .html: the dashboard page with the run inside
  std::string dashboard;           // [HOST:]PORT of the live dashboard; empty = none
  std::string log_jsonl;           // per-step JSON lines path
  std::string export_path;         // TorchScript of the trained model
  double target_accuracy = 0;      // 0 = off; else stop once test accuracy >= this
  double validation_split = 0;     // > 0: evaluate on this fraction held out of the training set
  int64_t eval_every = 0;          // steps; 0 = auto (8 times an epoch with a target, else epoch ends only)
  int64_t max_steps = 0;           // 0 = no limit
  int64_t early_stopping = 0;      // patience in evaluations; 0 = off
  bool skip_nonfinite = false;     // skip steps whose loss is inf/NaN instead of stopping
  std::string progress = "auto";   // auto | bar | log | none
  int64_t profile_steps = 0;       // > 0: profile this many steps and print the op table
  std::string trace;               // Chrome trace path for the profiled steps
  // Data-parallel training (dist/training.h); torchrun's variables, when set, take precedence.
  int64_t nproc = 1;                       // ranks on this machine, each on its share of the cores
  int64_t nnodes = 1;                      // machines in the job
  int64_t node_rank = 0;                   // this machine's index among them
  std::string master_addr = "127.0.0.1";   // the machine of rank 0, which serves the rendezvous
  int64_t master_port = 0;                 // 0 = a free port on one machine, 29500 across machines
  double dist_timeout = 60;                // seconds a rank waits for the others before failing
};

struct ConfigField {
  std::string name;   // snake_case; the flag is --name with dashes
  std::string help;
  bool is_flag;       // a boolean: `--name` alone sets it
  std::string type;   // the value's form in --help: INT, FLOAT, TEXT, PATH, INT,... (a list); BOOL for a flag
  std::function<void(TrainConfig&, const std::string&)> set;  // parses and validates
  std::function<std::string(const TrainConfig&)> get;
};

const std::vector<ConfigField>& config_fields();

// Sets one field from text. Throws UsageError naming the field for an unknown name or a bad value.
void set_field(TrainConfig& config, const std::string& name, const std::string& value);

// Reads a TOML file of `name = value` pairs (names as in config_fields()) over `config`.
// Throws UsageError naming the file and key for a syntax error, an unknown key or a bad value.
void apply_toml_file(TrainConfig& config, const std::string& path);

// The config as TOML that apply_toml_file() reads back to an equal config: every field, or with
// `relative_to` only those whose value differs from it (e.g. from the defaults).
std::string to_toml(const TrainConfig& config, const TrainConfig* relative_to = nullptr);

// Cross-field checks once everything is set (e.g. eval_every needs target_accuracy or a log).
void validate(const TrainConfig& config);

}  // namespace afterburner::train
