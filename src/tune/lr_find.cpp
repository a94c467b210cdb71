#include "afterburner/tune/lr_find.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "afterburner/core/error.h"

namespace afterburner::tune {

nlohmann::json LrFindResult::to_json() const {
  return {{"lrs", lrs},           {"losses", losses},           {"smoothed", smoothed},
          {"min_loss_lr", min_loss_lr}, {"suggestion", suggestion}, {"stop_reason", stop_reason}};
}

LrFindResult find_lr(const train::TrainConfig& config, const train::TrainingData& data, const LrFindOptions& options) {
  if (!(options.min_lr() > 0 && options.max_lr() > options.min_lr())) {
    throw UsageError("lr-find", fmt::format("the sweep must rise from a positive lr (got {} to {})", options.min_lr(),
                                            options.max_lr()));
  }
  if (options.steps() < 2) throw UsageError("lr-find", "needs at least 2 steps");
  LrFindResult found;
  std::vector<double> lrs;
  // lr_i = min_lr * (max_lr / min_lr)^(i / (steps - 1))
  for (int64_t i = 0; i < options.steps(); ++i) {
    lrs.push_back(options.min_lr() * std::pow(options.max_lr() / options.min_lr(), double(i) / double(options.steps() - 1)));
  }
  train::TrainingSession session(config, data);
  const auto losses = session.losses_at(lrs);
  found.stop_reason = fmt::format("swept to lr {:.3g}", options.max_lr());
  // average_i = beta * average_{i-1} + (1 - beta) * loss_i, reported as average_i / (1 - beta^(i+1)).
  double average = 0, lowest = INFINITY;
  for (size_t i = 0; i < losses.size(); ++i) {
    if (!std::isfinite(losses[i])) {
      found.stop_reason = fmt::format("the loss was not finite at lr {:.3g}", lrs[i]);
      break;
    }
    average = options.smoothing() * average + (1 - options.smoothing()) * losses[i];
    const double smoothed = average / (1 - std::pow(options.smoothing(), double(i + 1)));
    found.lrs.push_back(lrs[i]);
    found.losses.push_back(losses[i]);
    found.smoothed.push_back(smoothed);
    if (smoothed < lowest) {
      lowest = smoothed;
      found.min_loss_lr = lrs[i];
    }
    if (smoothed > options.divergence() * lowest) {
      found.stop_reason = fmt::format("the loss diverged at lr {:.3g}", lrs[i]);
      break;
    }
  }
  found.suggestion = found.min_loss_lr / 10;
  return found;
}

}  // namespace afterburner::tune
