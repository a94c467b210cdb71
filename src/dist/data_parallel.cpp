#include "afterburner/dist/data_parallel.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <cstdlib>
#include <unordered_map>

namespace afterburner::dist {
namespace {

constexpr size_t kMiB = 1 << 20;
constexpr size_t kBroadcastBucketBytes = 250 * kMiB;  // Python's _sync_module_states

// c10d's message, with the parameter it names by index ("params[4] ...") named as the model
// names it.
std::string name_parameter(const std::exception& e, const std::unordered_map<size_t, std::string>& names) {
  const std::string reason = first_line(e);
  const auto at = reason.find("params[");
  if (at == std::string::npos) return reason;
  const auto index = std::strtoull(reason.c_str() + at + 7, nullptr, 10);
  const auto name = names.find(index);
  return name == names.end() ? reason : fmt::format("parameter '{}': {}", name->second, reason);
}

}  // namespace

// The Reducer and its Logger, built as torch/nn/parallel/distributed.py (1.13) builds them.
struct DataParallel::Engine {
  Group group;
  std::shared_ptr<c10d::Reducer> reducer;
  std::shared_ptr<c10d::Logger> logger;  // the Reducer uses it on one path without a null check
};

DataParallel::DataParallel(const train::Model& model, const Group& group, const DataParallelOptions& options)
    : engine_(std::make_unique<Engine>()) {
  engine_->group = group;
  std::vector<at::Tensor> parameters;
  std::unordered_map<size_t, std::string> names;
  for (const auto& [name, parameter] : model.named_parameters()) {
    if (!parameter.requires_grad()) continue;
    names[parameters.size()] = name;
    parameters.push_back(parameter);
  }
  try {
    c10d::verify_params_across_processes(group.process_group, parameters, c10::nullopt);
  } catch (const std::exception& e) {
    throw DistError(fmt::format("rank {}: its model differs from rank 0's: {}", group.rank, name_parameter(e, names)));
  }
  std::vector<at::Tensor> states = parameters;
  for (const auto& buffer : model.buffers()) states.push_back(buffer);
  {
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(group.process_group, states, kBroadcastBucketBytes, /*rank=*/0);
  }
  const size_t bucket_bytes = static_cast<size_t>(options.bucket_mb()) * kMiB;
  const size_t first_bucket_bytes = static_cast<size_t>(options.first_bucket_mb()) * kMiB;
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(parameters, {first_bucket_bytes, bucket_bytes},
                                                                    std::vector<bool>(parameters.size(), false));
  // Gradients are ready from the last layer backwards: the reversed buckets fill in that order.
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  engine_->reducer = std::make_shared<c10d::Reducer>(
      parameters, buckets, limits, group.process_group, std::vector<bool>(parameters.size(), false),
      static_cast<int64_t>(bucket_bytes), /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/false, names,
      static_cast<int64_t>(first_bucket_bytes));
  engine_->logger = std::make_shared<c10d::Logger>(engine_->reducer);
  engine_->reducer->set_logger(engine_->logger);
  engine_->reducer->set_ddp_runtime_logging_sample_rate(1);  // time every step, not one in 100
}

DataParallel::~DataParallel() = default;

int64_t DataParallel::rank() const { return engine_->group.rank; }

int64_t DataParallel::world_size() const { return engine_->group.world_size; }

// As DistributedDataParallel._pre_forward (1.13) does.
void DataParallel::before_forward(bool synchronised) {
  if (synchronised) {
    engine_->logger->set_runtime_stats_and_log();  // the previous synchronised step's timings
    engine_->reducer->prepare_for_forward();
  }
  // After the first step the buckets follow the order in which gradients became ready.
  engine_->reducer->rebuild_buckets();
}

void DataParallel::before_backward() { engine_->reducer->prepare_for_backward({}); }

void DataParallel::sum(torch::Tensor& values) {
  std::vector<at::Tensor> tensors{values};
  engine_->group.process_group->allreduce(tensors)->wait();
}

train::CommunicationStats DataParallel::communication() {
  auto stats = engine_->logger->get_ddp_logging_data().ints_map;
  constexpr double kNanosecondsPerMs = 1e6;
  return {double(stats["avg_backward_comm_time"]) / kNanosecondsPerMs,
          double(stats["avg_backward_compute_comm_overlap_time"]) / kNanosecondsPerMs};
}

}  // namespace afterburner::dist
