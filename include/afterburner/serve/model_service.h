// The Service that serves a model repository: loads every model's TorchScript file, one
// batcher per model, warms every batch size up, and answers the Open Inference Protocol routes.
//
//   afterburner::serve::ModelService models("models/",
//                                           afterburner::serve::ModelServiceOptions().intra_op_threads(1));
//   models.infer("cnn", body, std::nullopt, [](afterburner::serve::Reply reply) { ... });
//   std::string text = models.metrics();
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "afterburner/core/threads.h"
#include "afterburner/core/version.h"
#include "afterburner/serve/repository.h"
#include "afterburner/serve/service.h"

namespace afterburner::serve {

struct ModelServiceOptions {
  // LibTorch intra-op threads while the service lives (0 = leave as is). The HTTP threads and
  // the model share the cores; batches bring the parallelism.
  TORCH_ARG(int, intra_op_threads) = 1;
  // false: every model runs one request per forward, whatever its config (for comparisons).
  TORCH_ARG(bool, dynamic_batching) = true;
  // true: the constructor returns once every model is warmed up, throwing if a warm-up failed.
  TORCH_ARG(bool, wait_for_warm_up) = true;
  TORCH_ARG(std::string, server_version) = version();
};

class ModelService : public Service {
 public:
  // Throws an afterburner::Error naming the file for a bad repository, config or model file.
  explicit ModelService(const std::string& repository_dir, ModelServiceOptions options = {});
  explicit ModelService(Repository repository, ModelServiceOptions options = {});
  ~ModelService() override;

  // Blocks until ready(); throws Error naming the model file if a warm-up failed.
  void wait_until_ready() const;

  bool live() const override;
  bool ready() const override;
  Reply server_metadata() const override;
  Reply model_metadata(std::string_view model) const override;
  Reply model_ready(std::string_view model) const override;
  void infer(std::string_view model, std::string body, std::optional<std::size_t> json_length,
             ReplyCallback reply) override;
  void infer_images(std::string_view model, std::vector<std::string> images, int64_t top_k,
                    ReplyCallback reply) override;
  void infer_tensors(std::string_view model, const TensorRequest& request, TensorReplyCallback reply) override;
  std::string metrics() const override;

 private:
  struct Model;
  Model* find(std::string_view name) const;
  // The request's inputs to the model's batcher; answers with `encode` of the outputs.
  void submit(Model& model, std::vector<at::Tensor> inputs,
              std::function<Reply(const std::vector<at::Tensor>&)> encode, ReplyCallback reply);

  ModelServiceOptions options_;
  ThreadsGuard threads_;
  std::mutex startup_;  // held while a model loads or warms up: one at a time
  std::vector<std::unique_ptr<Model>> models_;  // by name; after startup_, which its batchers use
};

}  // namespace afterburner::serve
