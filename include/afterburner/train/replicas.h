// Data-parallel training as the Trainer sees it: the same loop runs on every rank, each on its
// shard, and these calls keep the ranks in step. dist::DataParallel implements them on c10d;
// the trainer knows no transport.
//
//   TrainingSession session(config, data, {/*batch_norm=*/sync_batch_norm_factory, [&](const train::Model& model) {
//     return std::make_shared<afterburner::dist::DataParallel>(model, group);
//   }});
//   session.fit();   // shards the data by rank, averages gradients, sums losses and evaluations
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "afterburner/models/residual.h"
#include "afterburner/train/model.h"
#include "afterburner/train/report.h"

namespace afterburner::train {

class Replicas {
 public:
  virtual ~Replicas() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  // Before each micro-batch's forward. `synchronised`: its backward averages the gradients over
  // the ranks (a step's last micro-batch); the others' only accumulate them locally (no_sync).
  virtual void before_forward(bool synchronised) = 0;
  // After a synchronised micro-batch's forward, before its backward.
  virtual void before_backward() = 0;
  // Sums a small float64 tensor over the ranks, in place: step losses, stop votes, evaluation counts.
  virtual void sum(torch::Tensor& values) = 0;
  virtual CommunicationStats communication() = 0;
};

// Wraps the model the session builds (after it is built, before training starts).
using Replicate = std::function<std::shared_ptr<Replicas>(const Model& model)>;

// How a session trains as one rank of many: the batch normalisation its model is built with
// (over all ranks' batches), and the wrapper of the built model.
struct DataParallelism {
  models::BatchNorm2dFactory batch_norm = models::batch_norm_2d;
  Replicate replicate;
};

}  // namespace afterburner::train
