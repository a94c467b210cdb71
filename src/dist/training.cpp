#include "afterburner/dist/training.h"

#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <memory>

#include "afterburner/core/error.h"
#include "afterburner/dist/data_parallel.h"
#include "afterburner/dist/launch.h"
#include "afterburner/dist/sync_batch_norm.h"
#include "afterburner/monitor/dashboard.h"
#include "afterburner/serve/dashboard_server.h"
#include "afterburner/train/run.h"
#include "afterburner/train/session.h"
#include "heartbeat.h"

namespace afterburner::dist {
namespace {

// A rank's intra-op threads: --threads, else OMP_NUM_THREADS (the launchers' share of the cores),
// else all it may use.
int64_t rank_threads(const train::TrainConfig& config) {
  const char* variable = std::getenv("OMP_NUM_THREADS");
  if (config.threads > 0 || variable == nullptr) return config.threads;
  char* end = nullptr;
  const long threads = std::strtol(variable, &end, 10);
  if (*variable == '\0' || *end != '\0' || threads < 1) {
    throw UsageError("OMP_NUM_THREADS", fmt::format("expected a positive integer, got '{}'", variable));
  }
  return threads;
}

// The run, with the live dashboard --dashboard asks for on the process that reports (a single
// process, or rank 0): served from before the data loads to the run's end.
train::TrainReport run_observed(const train::TrainConfig& config, const train::DataParallelism& parallel,
                                bool reports) {
  if (config.dashboard.empty() || !reports) return train::run_training(config, parallel);
  const monitor::ListenAddress address = monitor::parse_listen_address(config.dashboard, "--dashboard");
  auto history = std::make_shared<train::TrainingHistory>();
  serve::DashboardServer dashboard([history] { return history->to_json(); },
                                   serve::HttpOptions().host(address.host).port(address.port),
                                   "afterburner train: " + config.model);
  std::cerr << "afterburner: dashboard on " << dashboard.url() << std::endl;
  return train::run_training(config, parallel, history);
}

}  // namespace

std::optional<train::TrainReport> run_training(const train::TrainConfig& config) {
  if (auto environment = options_from_environment()) return train_rank(config, *environment);
  if (config.nproc == 1 && config.nnodes == 1) return run_observed(config, {}, /*reports=*/true);
  // Once, here, rather than once per rank: a bad option or model file is one line, not one per rank.
  train::validate(config);
  if (train::is_model_file(config.model)) {
    train::load_user_model(config, train::load_training_data(config), /*data_parallel=*/true);
  }
  launch_local_ranks(current_command(), LaunchOptions()
                                            .nproc(config.nproc)
                                            .nnodes(config.nnodes)
                                            .node_rank(config.node_rank)
                                            .master_addr(config.master_addr)
                                            .master_port(config.master_port == 0 && config.nnodes > 1
                                                             ? 29500  // torchrun's default
                                                             : config.master_port));
  return std::nullopt;
}

std::optional<train::TrainReport> train_rank(const train::TrainConfig& config, GroupOptions options) {
  options.timeout(std::chrono::milliseconds(static_cast<int64_t>(config.dist_timeout * 1000)));
  train::TrainConfig rank_config = config;
  rank_config.threads = rank_threads(config);
  const Group group = join_group(options);
  const Heartbeat heartbeat(group, /*rank0_serves_store=*/!options.agent_store());
  try {
    train::DataParallelism parallel;
    parallel.batch_norm = [&](int64_t channels) { return torch::nn::AnyModule(SyncBatchNorm2d(channels, group)); };
    parallel.replicate = [&](const train::Model& model) { return std::make_shared<DataParallel>(model, group); };
    auto report = run_observed(rank_config, parallel, /*reports=*/group.rank == 0);
    if (group.rank != 0) return std::nullopt;
    return report;
  } catch (const std::exception& e) {  // c10d's when another rank is gone or stalled, as the step it stopped
    const std::string silent = heartbeat.silent_ranks();
    if (!silent.empty()) throw DistError(fmt::format("rank {}: training stopped: {} ({})", group.rank, silent, first_line(e)));
    if (dynamic_cast<const Error*>(&e)) throw;
    throw DistError(fmt::format("rank {}: training stopped: {}", group.rank, first_line(e)));
  }
}

}  // namespace afterburner::dist
