// afterburner tune: which techniques make this model train faster here, and a configuration.
#include <iostream>
#include <memory>

#include "afterburner/train/config.h"
#include "afterburner/train/interrupt.h"
#include "afterburner/tune/tune.h"
#include "commands.h"
#include "config_options.h"

namespace afterburner::tools {
namespace {

struct TuneFlags {
  double time_budget = 300;
  std::string report_dir;
  std::string objective = "throughput";
  double memory_budget_mb = 0;
  int64_t rounds = 3;
  bool lr_find = false;
};

}  // namespace

Command add_tune_command(CLI::App& app) {
  auto* sub = app.add_subcommand("tune", "measure each training technique on this model and machine, and recommend a "
                                         "configuration for `train --config`");
  // Train's outputs have no meaning here, and --report names tune's directory.
  auto options = std::make_shared<ConfigOptions>(
      sub, train::TrainConfig{},
      std::set<std::string>{"report", "dashboard", "export", "log_jsonl", "checkpoint_dir", "checkpoint_every", "resume", "trace",
                            "profile", "progress"});
  auto flags = std::make_shared<TuneFlags>();
  sub->add_option("--time-budget", flags->time_budget, "seconds for all trials and accuracy checks, roughly")
      ->capture_default_str();
  sub->add_option("--report", flags->report_dir, "directory for tune.json, recommended.toml and report.md")
      ->type_name("PATH")
      ->required();
  sub->add_option("--objective", flags->objective,
                  "throughput: samples/s of each technique; time-to-accuracy: the recipe that reaches "
                  "--target-accuracy soonest on a validation split")
      ->check(CLI::IsMember({"throughput", "time-to-accuracy"}))
      ->capture_default_str();
  sub->add_flag("--lr-find", flags->lr_find, "run a learning-rate range test first, and plot it");
  sub->add_option("--memory-budget", flags->memory_budget_mb, "MB of tensor memory a training step may use (0 = any)")
      ->capture_default_str();
  sub->add_option("--rounds", flags->rounds, "alternating pairs per trial")->check(CLI::Range(1, 100))->capture_default_str();
  return {sub, [options, flags] {
            train::StopOnInterrupt stop_on_ctrl_c;  // ends the current measurement, keeps the finished trials
            auto tune_options = tune::TuneOptions()
                                    .time_budget(flags->time_budget)
                                    .rounds(flags->rounds)
                                    .memory_budget_mb(flags->memory_budget_mb)
                                    .lr_find(flags->lr_find)
                                    .stop(&train::interrupt_requested())
                                    .log([](const std::string& line) { std::cerr << "afterburner: tune: " << line << "\n"; });
            auto result = flags->objective == "throughput" ? tune::tune_throughput(options->resolve(), tune_options)
                                                           : tune::tune_time_to_accuracy(options->resolve(), tune_options);
            tune::write_report(result, flags->report_dir);
            std::cout << tune::format_table(result) << "\n" << tune::format_recommendation(result, flags->report_dir);
            return result.interrupted ? 130 : 0;
          }};
}

}  // namespace afterburner::tools
