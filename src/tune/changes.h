// What tune varies: settings as changes of TrainConfig fields (by name, as text), and the user's
// configuration made quiet for measuring.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "afterburner/train/config.h"

namespace afterburner::tune {

using Changes = std::vector<std::pair<std::string, std::string>>;  // field name -> value text

std::string describe(const Changes& changes);  // "batch_size=64, lr=0.2"

// The fields whose value differs between `from` and `to`, with their value in `to`.
Changes differences(const train::TrainConfig& from, const train::TrainConfig& to);

train::TrainConfig with(const train::TrainConfig& base, const Changes& changes);

// The user's options for measuring: nothing written, nothing printed, no stopping early.
train::TrainConfig trial_base(const train::TrainConfig& user);

// Whether this CPU and LibTorch build compute the precision named ("fp32", "bf16", "fp16").
bool precision_runs(const std::string& name);
// The precision `config` trains in, "auto" resolved.
std::string effective_precision(const train::TrainConfig& config);

}  // namespace afterburner::tune
