#include "afterburner/train/report.h"

#include <fmt/format.h>

#include <algorithm>

namespace afterburner::train {

void to_json(nlohmann::json& j, const EvalPoint& point) {
  j = {{"step", point.step}, {"samples", point.samples}, {"train_seconds", point.train_seconds},
       {"accuracy", point.accuracy}, {"loss", point.loss}};
}

namespace {

double hidden_share(const CommunicationStats& stats) {
  return stats.ms_per_step > 0 ? stats.hidden_ms_per_step / stats.ms_per_step : 0;
}

}  // namespace

nlohmann::json TrainReport::to_json() const {
  nlohmann::json j{{"config", config},
                   {"model", model},
                   {"precision", precision},
                   {"batch_size", batch_size},
                   {"threads", threads},
                   {"workers", workers},
                   {"world_size", world_size},
                   {"communication", nullptr},
                   {"trainable_parameters", trainable_parameters},
                   {"steps", steps},
                   {"skipped_steps", skipped_steps},
                   {"evaluated_on", evaluated_on},
                   {"data",
                    {{"format", data.format},
                     {"train_samples", data.train_samples},
                     {"evaluation_samples", data.evaluation_samples},
                     {"sample", data.sample},
                     {"classes", data.classes},
                     {"mean", data.mean},
                     {"std", data.std},
                     {"skipped", data.skipped},
                     {"order", data.order},
                     {"transforms", data.transforms},
                     {"evaluation_transforms", data.evaluation_transforms}}},
                   {"schedule", schedule},
                   {"test_accuracy", test_accuracy},
                   {"test_accuracy_per_epoch", test_accuracy_per_epoch},
                   {"train_samples_per_sec", train_samples_per_sec},
                   {"epoch_seconds", epoch_seconds},
                   {"train_seconds", train_seconds},
                   {"train_seconds_to_target", nullptr},
                   {"samples_to_target", nullptr},
                   {"eval_seconds", eval_seconds},
                   {"evaluations", evaluations},
                   {"peak_rss_mb", peak_rss_mb},
                   {"peak_tensor_mb", peak_tensor_mb},
                   {"stop_reason", stop_reason},
                   {"timing", timing}};
  if (!error.empty()) j["error"] = error;
  j["checkpointed_step"] = checkpointed_step ? nlohmann::json(*checkpointed_step) : nlohmann::json(nullptr);
  if (train_seconds_to_target) j["train_seconds_to_target"] = *train_seconds_to_target;
  if (samples_to_target) j["samples_to_target"] = *samples_to_target;
  if (communication) {
    j["communication"] = {{"ms_per_step", communication->ms_per_step},
                          {"hidden_ms_per_step", communication->hidden_ms_per_step},
                          {"hidden_share", hidden_share(*communication)}};
  }
  return j;
}

std::string TrainReport::summary() const {
  std::string text = fmt::format("model {} ({} trainable parameters) | precision {} | batch {} | threads {} | workers {}\n",
                                 model, trainable_parameters, precision, batch_size, threads, workers);
  if (data.train_samples > 0) {
    constexpr size_t kNamed = 6;  // class names shown; the report's JSON has them all
    const std::vector<std::string> named(data.classes.begin(),
                                         data.classes.begin() + std::min(kNamed, data.classes.size()));
    const std::string sample = data.sample.size() == 1 ? fmt::format("rows of {} features", data.sample[0])
                                                       : fmt::format("images {}", fmt::join(data.sample, "x"));
    text += fmt::format("data               {} training {}, {} {}, {} classes ({}{})\n", data.train_samples, sample,
                        data.evaluation_samples, evaluated_on, data.classes.size(),
                        fmt::join(named, ", "), data.classes.size() > kNamed ? ", ..." : "");
  }
  if (!data.transforms.empty() || !data.evaluation_transforms.empty()) {
    text += fmt::format("transforms         {}{}\n", data.transforms.empty() ? "none" : data.transforms,
                        data.evaluation_transforms.empty() ? "" : "; evaluation " + data.evaluation_transforms);
  }
  if (!data.skipped.empty()) {
    text += fmt::format("skipped            {} bad input(s), listed in the report; the first: {}\n",
                        data.skipped.size(), data.skipped.front());
  }
  if (world_size > 1) {
    text += fmt::format("ranks              {}, each with batch {} (speeds and samples count all ranks)\n", world_size,
                        batch_size / world_size);
  }
  if (communication) {
    text += fmt::format("communication      {:.2f} ms per step, {:.0f}% hidden behind backward\n",
                        communication->ms_per_step, 100 * hidden_share(*communication));
  }
  if (evaluations.empty() && test_accuracy_per_epoch.empty()) {
    text += fmt::format("{:<18} not evaluated", evaluated_on + " accuracy");
  } else {
    text += fmt::format("{:<18} {:.4f}", evaluated_on + " accuracy", test_accuracy);
  }
  if (!test_accuracy_per_epoch.empty()) {
    text += fmt::format(" (per epoch: {:.4f})", fmt::join(test_accuracy_per_epoch, ", "));
  }
  text += fmt::format("\ntraining speed     {:.0f} samples/s over {} steps ({:.1f} s of training)\n",
                      train_samples_per_sec, steps, train_seconds);
  if (train_seconds_to_target) {
    text += fmt::format("time to target     {:.1f} s, {} samples\n", *train_seconds_to_target, samples_to_target.value_or(0));
  }
  text += fmt::format("schedule           {}\n", schedule);
  text += fmt::format("evaluation         {} evaluations, {:.1f} s (not in the training time)\n", evaluations.size(),
                      eval_seconds);
  text += fmt::format("stopped            {}\n", error.empty() ? stop_reason : stop_reason + ": " + error);
  if (skipped_steps > 0) text += fmt::format("skipped steps      {}\n", skipped_steps);
  text += "time per step      phase       total s   mean ms  median ms   share\n";
  for (size_t i = 0; i < profile::kPhaseCount; ++i) {
    const auto& phase = timing.phases[i];
    double share = timing.total_s > 0 ? 100 * phase.total_s / timing.total_s : 0;
    text += fmt::format("                   {:<10} {:8.2f} {:9.2f} {:10.2f} {:6.1f}%\n",
                        profile::phase_name(static_cast<profile::Phase>(i)), phase.total_s, phase.mean_ms,
                        phase.median_ms, share);
  }
  text += fmt::format("peak memory        {:.0f} MiB resident, {:.0f} MiB in tensors\n", peak_rss_mb, peak_tensor_mb);
  return text;
}

}  // namespace afterburner::train
