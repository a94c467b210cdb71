// The Service that serves a model repository: loads every model's TorchScript file, one
// batcher per model, warms every batch size up, and answers the Open Inference Protocol routes.
// Models can be loaded, reloaded and unloaded while serving (model control): a request already
// taken by a model finishes on it, the next ones go to its successor once that is warmed up.
//
//   afterburner::serve::ModelService models("models/",
//                                           afterburner::serve::ModelServiceOptions().intra_op_threads(1));
//   models.infer("cnn", body, std::nullopt, [](afterburner::serve::Reply reply) { ... });
//   std::string text = models.metrics();
//
//   afterburner::serve::ModelService polled("models/", afterburner::serve::ModelServiceOptions()
//                                                          .model_control(afterburner::serve::ModelControl::poll)
//                                                          .poll_interval(std::chrono::seconds(5)));
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "afterburner/core/threads.h"
#include "afterburner/core/version.h"
#include "afterburner/serve/metrics.h"
#include "afterburner/serve/repository.h"
#include "afterburner/serve/service.h"

namespace afterburner::serve {

// How the served models follow the repository (Triton's --model-control-mode).
enum class ModelControl {
  none,       // every model loads at start and stays
  poll,       // the repository is read again every poll_interval: models added, changed (config,
              // model file, a new version directory) or removed there are loaded, reloaded or
              // unloaded; a reload that fails keeps the model being served
  explicit_,  // load_models at start, then what load_model and unload_model say
};

// "none", "poll" or "explicit"; throws UsageError naming --model-control for anything else.
ModelControl parse_model_control(std::string_view name);

struct ModelServiceOptions {
  // LibTorch intra-op threads while the service lives (0 = leave as is). The HTTP threads and
  // the model share the cores; batches bring the parallelism.
  TORCH_ARG(int, intra_op_threads) = 1;
  // false: every model runs one request per forward, whatever its config (for comparisons).
  TORCH_ARG(bool, dynamic_batching) = true;
  // true: the constructor returns once every model is warmed up, throwing if a warm-up failed.
  TORCH_ARG(bool, wait_for_warm_up) = true;
  TORCH_ARG(std::string, server_version) = version();
  TORCH_ARG(ModelControl, model_control) = ModelControl::none;
  TORCH_ARG(std::chrono::milliseconds, poll_interval) = std::chrono::seconds(15);
  TORCH_ARG(std::vector<std::string>, load_models) = {};  // explicit_: the models loaded at start
  // Told each load, unload and failure to load after start, as one line.
  TORCH_ARG(std::function<void(const std::string&)>, log) = nullptr;
};

class ModelService : public Service {
 public:
  // Throws an afterburner::Error naming the file for a bad repository, config or model file
  // (with explicit_ model control: of the models it loads at start).
  explicit ModelService(const std::string& repository_dir, ModelServiceOptions options = {});
  // Serves the repository's models, and takes the models to load and unload from its directory.
  explicit ModelService(Repository repository, ModelServiceOptions options = {});
  // After the models' queued requests are answered.
  ~ModelService() override;

  // Blocks until ready(); throws Error naming the model file if a warm-up failed.
  void wait_until_ready() const;

  bool live() const override;
  bool ready() const override;
  Reply server_metadata() const override;
  Reply model_metadata(ModelRef model) const override;
  Reply model_ready(ModelRef model) const override;
  void infer(ModelRef model, std::string body, std::optional<std::size_t> json_length, ReplyCallback reply) override;
  void infer_images(ModelRef model, std::vector<std::string> images, int64_t top_k, ReplyCallback reply) override;
  void infer_tensors(ModelRef model, const TensorRequest& request, TensorReplyCallback reply) override;
  std::string metrics() const override;

  Reply repository_index(std::string_view body) const override;
  // With explicit_ model control: loads the model, or its latest version again, from the
  // repository, warms it up and puts it in place of the one served (400 naming the file if it
  // cannot be loaded: the one served stays); unload_model stops serving it.
  void load_model(std::string_view model, ReplyCallback reply) override;
  void unload_model(std::string_view model, ReplyCallback reply) override;

 private:
  struct Model;
  // A model directory's state: the model served, if any, and why none is.
  struct Entry {
    std::shared_ptr<Model> model;
    std::shared_ptr<ModelMetrics> metrics;  // kept across reloads: its counters only grow
    std::string stamp;                      // of the files last loaded or tried (ModelFiles::stamp)
    std::string reason;                     // of the last failure or unload
    bool loading = false;
  };

  // The model `ref` names; else nullptr, with why (a 404) in `not_found`.
  std::shared_ptr<Model> find(ModelRef ref, std::string& not_found) const;
  // The request's inputs to the model's batcher; answers with `encode` of the outputs.
  static void submit(std::shared_ptr<Model> model, std::chrono::steady_clock::time_point arrival,
                     std::vector<at::Tensor> inputs, std::function<Reply(const std::vector<at::Tensor>&)> encode,
                     ReplyCallback reply);

  // Model control, on the control thread (see control_loop).
  void start(ModelConfig config);
  Reply load(const std::string& name);
  Reply unload(const std::string& name, const std::string& reason);
  void poll_repository();
  void retire(std::shared_ptr<Model> model);
  void release_retired(bool wait);
  void run_on_control_thread(std::function<void()> job);
  void control_loop();
  void log(const std::string& line) const;

  ModelServiceOptions options_;
  ThreadsGuard threads_;
  std::filesystem::path repository_dir_;
  std::mutex startup_;  // held while a model loads or warms up: one at a time

  mutable std::shared_mutex entries_mutex_;
  std::map<std::string, Entry, std::less<>> entries_;  // by model name; after startup_, which batchers use

  // The control thread's work: load and unload requests, polls, and freeing replaced models once
  // their last request is answered (never on a batcher's own thread, which its destructor joins).
  std::mutex control_mutex_;
  std::condition_variable control_wake_;
  std::deque<std::function<void()>> control_jobs_;
  bool control_stopping_ = false;
  std::vector<std::shared_ptr<Model>> retired_;  // control thread only
  std::thread control_;
};

}  // namespace afterburner::serve
