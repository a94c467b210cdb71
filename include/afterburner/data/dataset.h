// Datasets are random access by a *batch* of indices, so collating a batch is one
// vectorized gather instead of N single-sample reads and a stack. Views compose.
//
//   auto all = std::make_shared<TensorDataset>(images, labels);      // [N, ...], [N]
//   auto head = std::make_shared<SubsetDataset>(all, torch::arange(1000));
//   Batch batch = head->get_batch(torch::tensor({3, 1, 4}, torch::kLong));
//   // batch.input: [3, ...] contiguous, batch.target: [3] int64
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace afterburner::data {

struct Batch {
  torch::Tensor input;   // [n, ...]
  torch::Tensor target;  // [n] int64
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // indices: 1-D int64, each in [0, size()). Returns contiguous tensors in index order.
  virtual Batch get_batch(const torch::Tensor& indices) const = 0;
  // The block of storage each sample is read from (a pack's 4 MiB blocks), int64 [size()], for
  // an order that reads data larger than memory a few blocks at a time (loader.h,
  // LoaderOptions::block_local); undefined: the samples are in memory, or no blocks are known.
  virtual torch::Tensor storage_blocks() const { return {}; }
};
using DatasetPtr = std::shared_ptr<const Dataset>;

// Which part of a dataset stored with both: the training or the test (evaluation) samples.
enum class Split { train, test };

// A classification dataset and its classes' names: label i is classes[i].
struct LabelledDataset {
  DatasetPtr dataset;
  std::vector<std::string> classes;
};

// "0", "1", ...: the names of `count` classes stored only as numbers.
std::vector<std::string> numbered_classes(int64_t count);

// The classes numbered up to the largest of `labels` (none for no labels). Throws DataError naming
// `source` for a label of a million or more: a corrupt value, not a class to allocate for.
std::vector<std::string> classes_up_to_largest(const torch::Tensor& labels, const std::string& source);

// Samples held in memory; get_batch is one index_select per tensor.
class TensorDataset : public Dataset {
 public:
  // inputs [N, ...]; targets [N] of any integer type (stored as int64).
  TensorDataset(torch::Tensor inputs, torch::Tensor targets);
  int64_t size() const override;
  Batch get_batch(const torch::Tensor& indices) const override;
  const torch::Tensor& inputs() const { return inputs_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor inputs_;
  torch::Tensor targets_;
};

// The samples of `base` at `indices` (a train/validation split, a shard, a debug slice),
// without copying them.
class SubsetDataset : public Dataset {
 public:
  SubsetDataset(DatasetPtr base, torch::Tensor indices);
  int64_t size() const override;
  Batch get_batch(const torch::Tensor& indices) const override;
  torch::Tensor storage_blocks() const override;

 private:
  DatasetPtr base_;
  torch::Tensor indices_;
};

// Throws UsageError("indices", ...) unless `indices` is 1-D int64 with every value in [0, size).
void check_indices(const torch::Tensor& indices, int64_t size);

// The inputs a run skips rather than stops at (`afterburner train --skip-corrupt`): a corrupt or
// unreadable file, a CSV row, a sample whose label is not a class. Each is one "source: problem"
// line, recorded once, in the order first met; any thread may record.
//
//   SkippedInputs skipped;
//   for (auto& file : files) skip_or_throw(&skipped, [&] { decode(file); });   // false: skipped
class SkippedInputs {
 public:
  void add(const std::string& line);
  std::vector<std::string> lines() const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
  std::unordered_set<std::string> seen_;
};

// Runs `read`: returns true when it succeeds; when it throws DataError, records the error in
// `skipped` and returns false, or rethrows it when `skipped` is null (skipping is off).
bool skip_or_throw(SkippedInputs* skipped, const std::function<void()>& read);

// Throws DataError naming `source` ("<source>: label 200 at index 17 is outside the model's 10
// classes") for the first of the 1-D integer `labels` that is not in [0, classes), so that a
// corrupt label stops a run when the data is loaded rather than deep inside the loss. With
// `skipped`, records every such label there instead. Returns the indices of the labels in range.
torch::Tensor check_labels(const torch::Tensor& labels, int64_t classes, const std::string& source,
                           SkippedInputs* skipped = nullptr);

}  // namespace afterburner::data
