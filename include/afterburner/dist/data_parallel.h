// Data-parallel training on c10d::Reducer, the engine behind Python's DistributedDataParallel:
// gradients are averaged over the ranks in buckets of about 25 MB, each bucket's allreduce
// launched during backward as soon as its gradients are ready, in the reverse order of the
// parameters; parameters and buffers start as rank 0's.
//
//   auto group = afterburner::dist::join_group(options);
//   afterburner::dist::DataParallel parallel(*model, group);     // broadcasts rank 0's weights
//   for (auto& batch : loader.epoch(epoch)) {                   // this rank's shard
//     parallel.before_forward();
//     auto loss = loss_fn(model->forward(batch.input), batch.target);
//     parallel.before_backward();                               // omit for no_sync micro-batches
//     loss.backward();                                          // grads: the mean over all ranks
//     optimizer.step();
//   }
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "afterburner/dist/group.h"

namespace afterburner::dist {

struct DataParallelOptions {
  TORCH_ARG(int64_t, bucket_mb) = 25;     // Python's bucket_cap_mb
  TORCH_ARG(int64_t, first_bucket_mb) = 1;  // the first bucket, small so that communication starts early
};

class DataParallel {
 public:
  // Checks that every rank has the same parameters (count, shapes, dtypes) and broadcasts rank 0's
  // parameters and buffers; DistError naming the difference otherwise.
  DataParallel(torch::nn::Module& model, const Group& group, const DataParallelOptions& options = DataParallelOptions());
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  void before_forward();
  // The next backward averages the gradients over the ranks. Without this call a backward only
  // accumulates locally (no_sync: gradient accumulation's micro-batches but the last).
  void before_backward();

 private:
  struct Engine;
  std::unique_ptr<Engine> engine_;
};

}  // namespace afterburner::dist
