#include "afterburner/data/dataset.h"

#include <fmt/format.h>

#include "afterburner/core/error.h"

namespace afterburner::data {

void check_indices(const torch::Tensor& indices, int64_t size) {
  if (indices.dim() != 1 || indices.scalar_type() != torch::kLong) {
    throw UsageError("indices", fmt::format("expected a 1-D int64 tensor, got {}-D {}", indices.dim(),
                                            c10::toString(indices.scalar_type())));
  }
  auto contiguous = indices.contiguous();
  const int64_t* values = contiguous.data_ptr<int64_t>();
  for (int64_t i = 0; i < contiguous.numel(); ++i) {
    if (values[i] < 0 || values[i] >= size) {
      throw UsageError("indices", fmt::format("index {} is out of range for {} samples", values[i], size));
    }
  }
}

std::vector<std::string> numbered_classes(int64_t count) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < count; ++i) names.push_back(std::to_string(i));
  return names;
}

std::vector<std::string> classes_up_to_largest(const torch::Tensor& labels, const std::string& source) {
  constexpr int64_t kMostClasses = 1'000'000;
  if (labels.numel() == 0) return {};
  const int64_t largest = labels.max().item<int64_t>();
  if (largest >= kMostClasses) {
    throw DataError(source, fmt::format("label {} is not a class index (classes are numbered from 0, below {})",
                                        largest, kMostClasses));
  }
  return numbered_classes(largest + 1);
}

void SkippedInputs::add(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (seen_.insert(line).second) lines_.push_back(line);
}

std::vector<std::string> SkippedInputs::lines() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lines_;
}

bool skip_or_throw(SkippedInputs* skipped, const std::function<void()>& read) {
  try {
    read();
    return true;
  } catch (const DataError& error) {
    if (skipped == nullptr) throw;
    skipped->add(error.what());
    return false;
  }
}

torch::Tensor check_labels(const torch::Tensor& labels, int64_t classes, const std::string& source,
                           SkippedInputs* skipped) {
  auto values = labels.to(torch::kLong).contiguous();
  const int64_t* label = values.data_ptr<int64_t>();
  std::vector<int64_t> in_range;
  for (int64_t i = 0; i < values.numel(); ++i) {
    if (skip_or_throw(skipped, [&] {
          if (label[i] < 0 || label[i] >= classes) {
            throw DataError(source, fmt::format("label {} at index {} is outside the model's {} classes", label[i],
                                                i, classes));
          }
        })) {
      in_range.push_back(i);
    }
  }
  return torch::tensor(in_range, torch::kLong);
}

TensorDataset::TensorDataset(torch::Tensor inputs, torch::Tensor targets) {
  if (inputs.dim() < 1) throw UsageError("inputs", "expected at least one dimension (the samples)");
  if (targets.dim() != 1) {
    throw UsageError("targets", fmt::format("expected a 1-D tensor, got {}-D", targets.dim()));
  }
  if (!c10::isIntegralType(targets.scalar_type(), /*includeBool=*/false)) {
    throw UsageError("targets", fmt::format("expected integer class labels, got {}",
                                            c10::toString(targets.scalar_type())));
  }
  if (inputs.size(0) != targets.size(0)) {
    throw UsageError("targets", fmt::format("{} targets for {} inputs", targets.size(0), inputs.size(0)));
  }
  inputs_ = inputs.contiguous();
  targets_ = targets.to(torch::kLong).contiguous();
}

int64_t TensorDataset::size() const { return inputs_.size(0); }

Batch TensorDataset::get_batch(const torch::Tensor& indices) const {
  check_indices(indices, size());
  return {inputs_.index_select(0, indices), targets_.index_select(0, indices)};
}

SubsetDataset::SubsetDataset(DatasetPtr base, torch::Tensor indices) : base_(std::move(base)) {
  if (!base_) throw UsageError("base", "is null");
  check_indices(indices, base_->size());
  indices_ = indices.contiguous();
}

int64_t SubsetDataset::size() const { return indices_.size(0); }

torch::Tensor SubsetDataset::storage_blocks() const {
  const torch::Tensor blocks = base_->storage_blocks();
  return blocks.defined() ? blocks.index_select(0, indices_) : blocks;
}

Batch SubsetDataset::get_batch(const torch::Tensor& indices) const {
  check_indices(indices, size());
  return base_->get_batch(indices_.index_select(0, indices));
}

}  // namespace afterburner::data
