#include "changes.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/train/precision.h"

namespace afterburner::tune {

std::string describe(const Changes& changes) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : changes) parts.push_back(name + "=" + value);
  return fmt::format("{}", fmt::join(parts, ", "));
}

Changes differences(const train::TrainConfig& from, const train::TrainConfig& to) {
  Changes changes;
  for (const auto& field : train::config_fields()) {
    if (field.get(to) != field.get(from)) changes.push_back({field.name, field.get(to)});
  }
  return changes;
}

train::TrainConfig with(const train::TrainConfig& base, const Changes& changes) {
  train::TrainConfig config = base;
  for (const auto& [name, value] : changes) train::set_field(config, name, value);
  return config;
}

train::TrainConfig trial_base(const train::TrainConfig& user) {
  train::TrainConfig config = user;
  for (const char* field : {"report", "log_jsonl", "export", "checkpoint_dir", "trace"}) train::set_field(config, field, "");
  config.resume = false;
  config.profile_steps = config.max_steps = config.early_stopping = 0;
  config.target_accuracy = 0;
  config.progress = "none";
  return config;
}

bool precision_runs(const std::string& name) {
  try {
    train::check_precision_supported(train::parse_precision(name), torch::kCPU);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string effective_precision(const train::TrainConfig& config) {
  if (config.precision != "auto") return config.precision;
  return train::cpu_has_native_bf16() ? "bf16" : "fp32";
}

}  // namespace afterburner::tune
