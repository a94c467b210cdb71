// Data-parallel training on c10d::Reducer, the engine behind Python's DistributedDataParallel:
// gradients are averaged over the ranks in buckets of about 25 MB, each bucket's allreduce
// launched during backward as soon as its gradients are ready, in the reverse order of the
// parameters; parameters and buffers start as rank 0's.
//
//   auto group = afterburner::dist::join_group(options);
//   afterburner::dist::DataParallel parallel(model, group);      // broadcasts rank 0's weights
//   for (auto& batch : loader.epoch(epoch)) {                   // this rank's shard
//     parallel.before_forward(/*synchronised=*/true);           // false for no_sync micro-batches
//     auto loss = loss_fn(model->forward(batch.input), batch.target);
//     parallel.before_backward();                               // only when synchronised
//     loss.backward();                                          // grads: the mean over all ranks
//     optimizer.step();
//   }
//
// It is the train::Replicas a TrainingSession takes: TrainingSession(config, data, replicate).
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "afterburner/dist/group.h"
#include "afterburner/train/replicas.h"

namespace afterburner::dist {

struct DataParallelOptions {
  TORCH_ARG(int64_t, bucket_mb) = 25;     // Python's bucket_cap_mb
  TORCH_ARG(int64_t, first_bucket_mb) = 1;  // the first bucket, small so that communication starts early
};

class DataParallel : public train::Replicas {
 public:
  // Checks that every rank has the same parameters (count, shapes, dtypes) and broadcasts rank 0's
  // parameters and buffers; DistError naming the difference otherwise.
  // `model`: a module holder or a TorchScript module (train::Model).
  DataParallel(const train::Model& model, const Group& group, const DataParallelOptions& options = DataParallelOptions());
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int64_t rank() const override;
  int64_t world_size() const override;
  void before_forward(bool synchronised) override;
  void before_backward() override;
  void sum(torch::Tensor& values) override;  // an allreduce on the group
  // The Reducer's averages over the steps so far (each recorded at the next step's forward).
  train::CommunicationStats communication() override;

 private:
  struct Engine;
  std::unique_ptr<Engine> engine_;
};

}  // namespace afterburner::dist
