#include "afterburner/serve/model_service.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <algorithm>
#include <set>
#include <utility>

#include "afterburner/core/error.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/infer/verify.h"
#include "afterburner/serve/batcher.h"
#include "afterburner/serve/image_input.h"
#include "afterburner/serve/metrics.h"
#include "afterburner/serve/protocol.h"

namespace afterburner::serve {

namespace {

// The floating-point dtypes of a model's weights: its parameters and buffers, or, frozen, the
// tensor constants of its forward.
std::set<at::ScalarType> weight_dtypes(const torch::jit::Module& module) {
  std::set<at::ScalarType> dtypes;
  auto add = [&dtypes](const at::Tensor& tensor) {
    if (tensor.is_floating_point()) dtypes.insert(tensor.scalar_type());
  };
  for (const auto& parameter : module.parameters()) add(parameter);
  for (const auto& buffer : module.buffers()) add(buffer);
  for (const torch::jit::Node* node : module.get_method("forward").graph()->nodes()) {
    const auto constant = node->kind() == c10::prim::Constant ? torch::jit::toIValue(node->output()) : c10::nullopt;
    if (constant && constant->isTensor()) add(constant->toTensor());
  }
  return dtypes;
}

std::string datatype_or_dtype(at::ScalarType dtype) {
  for (DataType datatype : {DataType::FP16, DataType::FP32, DataType::FP64}) {
    if (scalar_type(datatype) == dtype) return std::string(datatype_name(datatype));
  }
  return c10::toString(dtype);
}

// Why a model whose weights are all of one floating-point dtype may fail on its config's inputs:
// "input 'x' is FP16 in DIR/config.toml, but the model computes in FP32", or "" if no
// floating-point input differs from its weights.
std::string datatype_mismatch(const ModelConfig& config, const torch::jit::Module& module) {
  const std::set<at::ScalarType> weights = weight_dtypes(module);
  if (weights.size() != 1) return "";
  for (const auto& spec : config.inputs) {
    const at::ScalarType input = scalar_type(spec.datatype);
    if (at::isFloatingType(input) && input != *weights.begin()) {
      return fmt::format("input '{}' is {} in {}, but the model computes in {}", spec.name,
                         datatype_name(spec.datatype), config.config_file.string(), datatype_or_dtype(*weights.begin()));
    }
  }
  return "";
}

// Frozen and laid out for oneDNN as `afterburner optimize` verifies its output (a model that is
// already optimized, or a plain export, alike): the serving copy of the model.
torch::jit::Module load_torchscript(const ModelConfig& config) {
  torch::jit::Module module = infer::load_model(config.model_file.string());
  module.eval();
  try {
    return infer::prepare_for_inference(module);
  } catch (const std::exception& e) {
    throw infer::ModelError(config.model_file.string(), "cannot be prepared for serving (" + first_line(e) + ")");
  }
}

// Each instance has its own copy of the module: forward() on one module is not meant to run
// on several threads at once. Where the config's datatypes are not the model's, a failure says
// so first: LibTorch's own words name neither ("dense_to_mkldnn expects float or bfloat16
// tensor input" for FP16 images to an FP32 convolution).
Runner make_runner(const ModelConfig& config) {
  auto module = std::make_shared<torch::jit::Module>(load_torchscript(config));
  const std::string mismatch = datatype_mismatch(config, *module);
  return [module, mismatch](const std::vector<at::Tensor>& inputs) {
    try {
      return infer::output_tensors(module->forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())));
    } catch (const std::exception& e) {
      if (mismatch.empty()) throw;
      throw Error(fmt::format("{}: {}", mismatch, first_line(e)));
    }
  };
}

nlohmann::json tensor_metadata(const std::vector<TensorSpec>& specs) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& spec : specs) {
    std::vector<int64_t> shape{-1};
    shape.insert(shape.end(), spec.dims.begin(), spec.dims.end());
    list.push_back({{"name", spec.name}, {"datatype", std::string(datatype_name(spec.datatype))}, {"shape", shape}});
  }
  return list;
}

std::string stamp_of(const ModelConfig& config) {
  return ModelFiles{config.name, config.version, config.config_file, config.model_file}.stamp();
}

// A model name from a request is a directory of the repository, never a path out of it.
bool is_directory_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find_first_of("/\\") == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

using Clock = std::chrono::steady_clock;

// Counts a request's answer into its model's metrics: the status, and an answered one's time
// since it arrived.
void count_answer(ModelMetrics& metrics, int status, Clock::time_point arrival) {
  if (status == 200) {
    metrics.request_success += 1;
    metrics.request_duration.observe(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - arrival).count());
    return;
  }
  metrics.request_failure += 1;
  if (status == 503) metrics.request_rejected += 1;
}

Reply json_reply(const nlohmann::json& body) {
  Reply reply;
  // Model and tensor names come from directory names and config files: bytes that are no UTF-8
  // become U+FFFD rather than an exception.
  reply.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return reply;
}

}  // namespace

// Models load and warm up one at a time (`startup` held): LibTorch 1.13's bf16 convolutions
// can come out wrong for good when their first calls run in several threads at once. Seen as
// a served model whose 1-channel 3x3 stem read its weights in the wrong order at one batch size,
// for the life of the server, in about one start in 40 of 34 models under load; none in 200
// starts loaded one at a time.
struct ModelService::Model {
  Model(ModelConfig model_config, bool dynamic_batching, std::mutex& startup, std::shared_ptr<ModelMetrics> counters)
      : config(std::move(model_config)), metrics(std::move(counters)) {
    config.dynamic_batching = config.dynamic_batching && dynamic_batching;
    std::vector<Runner> runners;
    {
      std::lock_guard<std::mutex> one_at_a_time(startup);
      for (int64_t i = 0; i < config.instances; ++i) runners.push_back(make_runner(config));
    }
    batcher = std::make_unique<Batcher>(config, std::move(runners), *metrics, &startup);
  }

  ModelConfig config;
  std::shared_ptr<ModelMetrics> metrics;
  std::unique_ptr<Batcher> batcher;  // after metrics: it counts into them until joined
};

ModelControl parse_model_control(std::string_view name) {
  if (name == "none") return ModelControl::none;
  if (name == "poll") return ModelControl::poll;
  if (name == "explicit") return ModelControl::explicit_;
  throw UsageError("--model-control", fmt::format("'{}' is not one of none, poll, explicit", name));
}

ModelService::ModelService(const std::string& repository_dir, ModelServiceOptions options)
    : ModelService(options.model_control() == ModelControl::explicit_ ? Repository{repository_dir, {}}
                                                                        : load_repository(repository_dir),
                   std::move(options)) {}

ModelService::ModelService(Repository repository, ModelServiceOptions options)
    : options_(std::move(options)), threads_(options_.intra_op_threads()), repository_dir_(repository.dir) {
  if (options_.model_control() != ModelControl::explicit_ && !options_.load_models().empty()) {
    throw UsageError("--load-model", "takes effect with --model-control explicit only");
  }
  if (options_.model_control() == ModelControl::explicit_) {
    list_models(repository_dir_);  // throws for a missing repository
    for (const std::string& name : options_.load_models()) {
      if (!is_directory_name(name)) throw UsageError("--load-model", fmt::format("'{}' is no model name", name));
      repository.models.push_back(load_model_config(repository_dir_ / name));
    }
  }
  for (auto& config : repository.models) start(std::move(config));
  if (options_.wait_for_warm_up()) wait_until_ready();
  if (options_.model_control() != ModelControl::none) control_ = std::thread([this] { control_loop(); });
}

// Every batcher is shut down (its queue answered, its workers joined) before the models go: a
// model freed by the last callback holding it would join the thread running that callback.
ModelService::~ModelService() {
  if (control_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(control_mutex_);
      control_stopping_ = true;
    }
    control_wake_.notify_all();
    control_.join();
  }
  for (auto& [name, entry] : entries_) {
    if (entry.model) entry.model->batcher->shutdown();
  }
  for (auto& model : retired_) model->batcher->shutdown();
  release_retired(/*wait=*/true);
}

void ModelService::start(ModelConfig config) {
  const std::string name = config.name;
  auto metrics = std::make_shared<ModelMetrics>();
  Entry entry{nullptr, metrics, stamp_of(config), "", false};
  entry.model = std::make_shared<Model>(std::move(config), options_.dynamic_batching(), startup_, metrics);
  entries_.emplace(name, std::move(entry));
}

void ModelService::wait_until_ready() const {
  std::vector<std::shared_ptr<Model>> models;
  {
    std::shared_lock<std::shared_mutex> lock(entries_mutex_);
    for (const auto& [name, entry] : entries_) {
      if (entry.model) models.push_back(entry.model);
    }
  }
  for (const auto& model : models) model->batcher->wait_until_ready();
}

std::shared_ptr<ModelService::Model> ModelService::find(ModelRef ref, std::string& not_found) const {
  std::shared_lock<std::shared_mutex> lock(entries_mutex_);
  auto found = entries_.find(ref.name);
  if (found == entries_.end()) {
    lock.unlock();
    const bool in_repository = is_directory_name(ref.name) && std::filesystem::is_directory(repository_dir_ / ref.name);
    not_found = fmt::format(in_repository ? "model '{}' is not loaded" : "unknown model '{}'", ref.name);
    return nullptr;
  }
  const Entry& entry = found->second;
  if (!entry.model) {
    not_found = fmt::format("model '{}' is not loaded ({})", ref.name, entry.reason);
    return nullptr;
  }
  if (!ref.version.empty() && ref.version != entry.model->config.version) {
    not_found = fmt::format("model '{}' has no version '{}' (it serves version {})", ref.name, ref.version,
                            entry.model->config.version);
    return nullptr;
  }
  return entry.model;
}

bool ModelService::live() const { return true; }

bool ModelService::ready() const {
  std::shared_lock<std::shared_mutex> lock(entries_mutex_);
  return std::all_of(entries_.begin(), entries_.end(),
                     [](const auto& named) { return !named.second.model || named.second.model->batcher->ready(); });
}

Reply ModelService::server_metadata() const {
  std::vector<std::string> extensions{"binary_tensor_data"};
  if (options_.model_control() != ModelControl::none) extensions.emplace_back("model_repository");
  return json_reply({{"name", "afterburner"}, {"version", options_.server_version()}, {"extensions", extensions}});
}

Reply ModelService::model_metadata(ModelRef ref) const {
  std::string not_found;
  const std::shared_ptr<Model> model = find(ref, not_found);
  if (!model) return error_reply(404, not_found);
  return json_reply({{"name", model->config.name},
                     {"versions", {model->config.version}},
                     {"platform", "pytorch_torchscript"},
                     {"inputs", tensor_metadata(model->config.inputs)},
                     {"outputs", tensor_metadata(model->config.outputs)}});
}

Reply ModelService::model_ready(ModelRef ref) const {
  std::string not_found;
  const std::shared_ptr<Model> model = find(ref, not_found);
  if (!model) return error_reply(404, not_found);
  if (!model->batcher->ready()) return error_reply(400, fmt::format("model '{}' is not ready (warming up)", ref.name));
  return json_reply({{"name", model->config.name}, {"ready", true}});
}

void ModelService::infer(ModelRef ref, std::string body, std::optional<std::size_t> json_length, ReplyCallback reply) {
  const Clock::time_point arrival = Clock::now();
  std::string not_found;
  std::shared_ptr<Model> model = find(ref, not_found);
  if (!model) return reply(error_reply(404, not_found));
  auto fail = [&](int status, const std::string& message) {
    count_answer(*model->metrics, status, arrival);
    reply(error_reply(status, message));
  };
  if (std::optional<std::string> refused = model->batcher->refusal()) return fail(503, *refused);
  InferRequest request;
  try {
    request = parse_infer_request(body, json_length, model->config);
  } catch (const RequestError& e) {
    return fail(e.status(), e.what());
  } catch (const std::exception& e) {
    return fail(500, fmt::format("model '{}': {}", ref.name, e.what()));
  }
  std::vector<at::Tensor> inputs = std::move(request.inputs);
  auto encode = [config = &model->config, request = std::move(request)](const std::vector<at::Tensor>& outputs) {
    return encode_infer_response(*config, request, outputs);
  };
  submit(std::move(model), arrival, std::move(inputs), std::move(encode), std::move(reply));
}

void ModelService::infer_images(ModelRef ref, std::vector<std::string> images, int64_t top_k, ReplyCallback reply) {
  const Clock::time_point arrival = Clock::now();
  std::string not_found;
  std::shared_ptr<Model> model = find(ref, not_found);
  if (!model) return reply(error_reply(404, not_found));
  const ModelConfig& config = model->config;
  auto fail = [&](int status, const std::string& message) {
    count_answer(*model->metrics, status, arrival);
    reply(error_reply(status, message));
  };
  if (!config.image) {
    return fail(415, fmt::format("model '{}' takes tensors: its {} declares no input with format = \"image\"",
                                 ref.name, config.config_file.string()));
  }
  if (static_cast<int64_t>(images.size()) > config.max_batch_size) {
    return fail(400, fmt::format("{} images, more than model '{}' takes at once (max_batch_size {})", images.size(),
                                 ref.name, config.max_batch_size));
  }
  if (std::optional<std::string> refused = model->batcher->refusal()) return fail(503, *refused);
  // Decoding takes milliseconds an image: on LibTorch's inter-op pool, not on the io thread that
  // serves every other connection meanwhile.
  at::launch([model = std::move(model), arrival, images = std::move(images), top_k, reply = std::move(reply)]() mutable {
    at::Tensor input;
    try {
      input = decode_request_images(model->config, std::move(images));
    } catch (const RequestError& e) {
      count_answer(*model->metrics, e.status(), arrival);
      return reply(error_reply(e.status(), e.what()));
    }
    auto encode = [config = &model->config, top_k](const std::vector<at::Tensor>& outputs) {
      return encode_image_response(*config, outputs, top_k);
    };
    submit(std::move(model), arrival, {input}, std::move(encode), std::move(reply));
  });
}

void ModelService::infer_tensors(ModelRef ref, const TensorRequest& tensors, TensorReplyCallback reply) {
  const Clock::time_point arrival = Clock::now();
  std::string not_found;
  std::shared_ptr<Model> model = find(ref, not_found);
  auto fail = [&](int status, std::string message) {
    if (model) count_answer(*model->metrics, status, arrival);
    TensorReply failed;
    failed.status = status;
    failed.error = std::move(message);
    reply(std::move(failed));
  };
  if (!model) return fail(404, not_found);
  if (std::optional<std::string> refused = model->batcher->refusal()) return fail(503, *refused);
  InferRequest request;
  try {
    request = make_infer_request(tensors, model->config);
  } catch (const RequestError& e) {
    return fail(e.status(), e.what());
  }
  std::vector<at::Tensor> inputs = std::move(request.inputs);
  Batcher& batcher = *model->batcher;
  batcher.submit(std::move(inputs), [model = std::move(model), arrival, request = std::move(request),
                                     reply](BatchResult result) {
    TensorReply answer;
    answer.status = result.status;
    answer.error = std::move(result.error);
    answer.model_name = model->config.name;
    answer.model_version = model->config.version;
    answer.id = request.id;
    if (result.status == 200) {
      for (const auto& wanted : request.outputs) {
        const std::size_t index = spec_index(model->config.outputs, wanted.name);
        answer.outputs.emplace_back(wanted.name, result.outputs.at(index).contiguous());
      }
    }
    count_answer(*model->metrics, result.status, arrival);
    reply(std::move(answer));
  });
}

// The callback holds the model: a model replaced meanwhile still answers what it took.
void ModelService::submit(std::shared_ptr<Model> model, std::chrono::steady_clock::time_point arrival,
                          std::vector<at::Tensor> inputs, std::function<Reply(const std::vector<at::Tensor>&)> encode,
                          ReplyCallback reply) {
  Batcher& batcher = *model->batcher;
  batcher.submit(std::move(inputs), [model = std::move(model), arrival, encode = std::move(encode),
                                     reply](BatchResult result) {
    Reply encoded;
    if (result.status != 200) {
      encoded = error_reply(result.status, result.error);
    } else {
      try {
        encoded = encode(result.outputs);
      } catch (const std::exception& e) {
        encoded = error_reply(500, fmt::format("model '{}': {}", model->config.name, e.what()));
      }
    }
    count_answer(*model->metrics, encoded.status, arrival);
    reply(std::move(encoded));
  });
}

std::string ModelService::metrics() const {
  std::vector<std::pair<std::string, std::shared_ptr<ModelMetrics>>> loaded;
  {
    std::shared_lock<std::shared_mutex> lock(entries_mutex_);
    for (const auto& [name, entry] : entries_) {
      if (entry.model) loaded.emplace_back(name, entry.metrics);
    }
  }
  std::vector<std::pair<std::string_view, const ModelMetrics*>> all;
  for (const auto& [name, metrics] : loaded) all.emplace_back(name, metrics.get());
  return prometheus_text(all);
}

// Triton's index: every model directory of the repository, and every model served, with its
// state: READY, LOADING (loading or warming up) or UNAVAILABLE with the reason.
Reply ModelService::repository_index(std::string_view body) const {
  bool ready_only = false;
  if (!body.empty()) {
    const nlohmann::json request = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!request.is_object()) return error_reply(400, "repository index: the body is not a JSON object");
    if (request.contains("ready")) {
      if (!request["ready"].is_boolean()) return error_reply(400, "repository index: 'ready' is not true or false");
      ready_only = request["ready"].get<bool>();
    }
  }
  std::set<std::string> names;
  try {
    for (std::string& name : list_models(repository_dir_)) names.insert(std::move(name));
  } catch (const std::exception&) {
    // the directory is gone: the models served are still listed
  }
  nlohmann::json index = nlohmann::json::array();
  std::shared_lock<std::shared_mutex> lock(entries_mutex_);
  for (const auto& [name, entry] : entries_) names.insert(name);
  for (const std::string& name : names) {
    auto found = entries_.find(name);
    const Entry* entry = found == entries_.end() ? nullptr : &found->second;
    nlohmann::json item{{"name", name}};
    if (entry && entry->model) {
      item["version"] = entry->model->config.version;
      item["state"] = entry->model->batcher->ready() ? "READY" : "LOADING";
    } else {
      item["state"] = entry && entry->loading ? "LOADING" : "UNAVAILABLE";
    }
    // Beside a model served, why its last reload failed.
    const std::string reason = entry ? entry->reason : "not loaded";
    if (!reason.empty()) item["reason"] = reason;
    if (!ready_only || item["state"] == "READY") index.push_back(std::move(item));
  }
  return json_reply(index);
}

void ModelService::load_model(std::string_view model, ReplyCallback reply) {
  if (options_.model_control() != ModelControl::explicit_) {
    return reply(error_reply(400, fmt::format("model '{}': load requests need serve --model-control explicit", model)));
  }
  run_on_control_thread([this, name = std::string(model), reply = std::move(reply)] { reply(load(name)); });
}

void ModelService::unload_model(std::string_view model, ReplyCallback reply) {
  if (options_.model_control() != ModelControl::explicit_) {
    return reply(
        error_reply(400, fmt::format("model '{}': unload requests need serve --model-control explicit", model)));
  }
  run_on_control_thread([this, name = std::string(model), reply = std::move(reply)] { reply(unload(name, "unloaded")); });
}

// Loads and warms up the model's latest files beside the one served, then swaps them: the
// requests the old one took finish on it (retire).
Reply ModelService::load(const std::string& name) {
  if (!is_directory_name(name)) return error_reply(400, fmt::format("'{}' is no model name", name));
  if (!std::filesystem::is_directory(repository_dir_ / name)) {
    return error_reply(400, fmt::format("model '{}' not loaded: {}: no such model directory", name,
                                        (repository_dir_ / name).string()));
  }
  std::shared_ptr<ModelMetrics> metrics;
  {
    std::unique_lock<std::shared_mutex> lock(entries_mutex_);
    Entry& entry = entries_[name];
    if (!entry.metrics) entry.metrics = std::make_shared<ModelMetrics>();
    entry.loading = true;
    metrics = entry.metrics;
  }
  std::string stamp;
  std::shared_ptr<Model> model;
  std::string failure;
  try {
    const ModelFiles files = locate_model_files(repository_dir_ / name);
    stamp = files.stamp();
    model = std::make_shared<Model>(load_model_config(files), options_.dynamic_batching(), startup_, metrics);
    model->batcher->wait_until_ready();
  } catch (const std::exception& e) {
    failure = first_line(e);
    model = nullptr;
  }
  std::shared_ptr<Model> replaced;
  {
    std::unique_lock<std::shared_mutex> lock(entries_mutex_);
    Entry& entry = entries_[name];
    entry.loading = false;
    entry.stamp = stamp;  // a failed load is tried again once its files change
    if (model) {
      replaced = std::exchange(entry.model, model);
      entry.reason.clear();
    } else {
      entry.reason = failure;
    }
  }
  retire(std::move(replaced));
  if (!model) {
    log(fmt::format("model '{}' not loaded: {}", name, failure));
    return error_reply(400, fmt::format("model '{}' not loaded: {}", name, failure));
  }
  log(fmt::format("loaded model '{}' version {} ({})", name, model->config.version, model->config.model_file.string()));
  return json_reply({{"name", name}, {"version", model->config.version}, {"state", "READY"}});
}

Reply ModelService::unload(const std::string& name, const std::string& reason) {
  std::shared_ptr<Model> unloaded;
  {
    std::unique_lock<std::shared_mutex> lock(entries_mutex_);
    auto found = entries_.find(name);
    if (found == entries_.end() || !found->second.model) {
      return error_reply(400, fmt::format("model '{}' is not loaded", name));
    }
    unloaded = std::exchange(found->second.model, nullptr);
    found->second.reason = reason;
  }
  log(fmt::format("unloaded model '{}' version {} ({})", name, unloaded->config.version, reason));
  retire(std::move(unloaded));
  return json_reply({{"name", name}, {"state", "UNAVAILABLE"}, {"reason", reason}});
}

// Models whose files changed since they were last loaded or tried are loaded again, new ones
// loaded, and those whose directory went away unloaded.
void ModelService::poll_repository() {
  std::vector<std::string> names;
  try {
    names = list_models(repository_dir_);
  } catch (const std::exception& e) {
    return log(fmt::format("repository not read: {}", first_line(e)));
  }
  std::vector<std::string> changed, removed, forgotten;
  {
    std::shared_lock<std::shared_mutex> lock(entries_mutex_);
    for (const std::string& name : names) {
      std::string stamp;
      try {
        stamp = locate_model_files(repository_dir_ / name).stamp();
      } catch (const std::exception&) {
        // load() says why
      }
      auto found = entries_.find(name);
      if (found == entries_.end() || found->second.stamp != stamp) changed.push_back(name);
    }
    for (const auto& [name, entry] : entries_) {
      if (std::binary_search(names.begin(), names.end(), name)) continue;
      (entry.model ? removed : forgotten).push_back(name);
    }
  }
  for (const std::string& name : changed) load(name);
  for (const std::string& name : removed) unload(name, "removed from the repository");
  std::unique_lock<std::shared_mutex> lock(entries_mutex_);
  for (const std::string& name : forgotten) {  // failed to load, then removed: nothing left to list
    auto found = entries_.find(name);
    if (found != entries_.end() && !found->second.model) entries_.erase(found);
  }
}

void ModelService::retire(std::shared_ptr<Model> model) {
  if (model) retired_.push_back(std::move(model));
  release_retired(/*wait=*/false);
}

// A retired model goes once nothing else holds it: its requests answered, their callbacks gone.
void ModelService::release_retired(bool wait) {
  while (true) {
    retired_.erase(std::remove_if(retired_.begin(), retired_.end(), [](const auto& model) { return model.use_count() == 1; }),
                   retired_.end());
    if (retired_.empty() || !wait) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ModelService::run_on_control_thread(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(control_mutex_);
    control_jobs_.push_back(std::move(job));
  }
  control_wake_.notify_all();
}

// Jobs in order of arrival, a poll every poll_interval (poll model control), and retired
// models looked at every few milliseconds until they are gone. Jobs still queued at the end
// are run: each has a reply to give.
void ModelService::control_loop() {
  constexpr std::chrono::milliseconds kRetiredCheck{20};
  const bool polling = options_.model_control() == ModelControl::poll;
  Clock::time_point next_poll = Clock::now() + options_.poll_interval();
  std::unique_lock<std::mutex> lock(control_mutex_);
  while (true) {
    if (!control_jobs_.empty()) {
      std::function<void()> job = std::move(control_jobs_.front());
      control_jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
      continue;
    }
    if (control_stopping_) return;
    Clock::time_point wake = polling ? next_poll : Clock::time_point::max();
    if (!retired_.empty()) wake = std::min(wake, Clock::now() + kRetiredCheck);
    control_wake_.wait_until(lock, wake);
    lock.unlock();
    release_retired(/*wait=*/false);
    if (polling && Clock::now() >= next_poll) {
      poll_repository();
      next_poll = Clock::now() + options_.poll_interval();
    }
    lock.lock();
  }
}

void ModelService::log(const std::string& line) const {
  if (options_.log()) options_.log()(line);
}

}  // namespace afterburner::serve
