#include "afterburner/serve/model_service.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <algorithm>
#include <set>

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
  Model(ModelConfig model_config, bool dynamic_batching, std::mutex& startup) : config(std::move(model_config)) {
    config.dynamic_batching = config.dynamic_batching && dynamic_batching;
    std::vector<Runner> runners;
    {
      std::lock_guard<std::mutex> one_at_a_time(startup);
      for (int64_t i = 0; i < config.instances; ++i) runners.push_back(make_runner(config));
    }
    batcher = std::make_unique<Batcher>(config, std::move(runners), metrics, &startup);
  }

  ModelConfig config;
  ModelMetrics metrics;
  std::unique_ptr<Batcher> batcher;  // after metrics: it counts into them until joined
};

ModelService::ModelService(const std::string& repository_dir, ModelServiceOptions options)
    : ModelService(load_repository(repository_dir), std::move(options)) {}

ModelService::ModelService(Repository repository, ModelServiceOptions options)
    : options_(std::move(options)), threads_(options_.intra_op_threads()) {
  for (auto& config : repository.models) {
    models_.push_back(std::make_unique<Model>(std::move(config), options_.dynamic_batching(), startup_));
  }
  if (options_.wait_for_warm_up()) wait_until_ready();
}

ModelService::~ModelService() = default;

void ModelService::wait_until_ready() const {
  for (const auto& model : models_) model->batcher->wait_until_ready();
}

ModelService::Model* ModelService::find(std::string_view name) const {
  for (const auto& model : models_) {
    if (model->config.name == name) return model.get();
  }
  return nullptr;
}

bool ModelService::live() const { return true; }

bool ModelService::ready() const {
  return std::all_of(models_.begin(), models_.end(), [](const auto& model) { return model->batcher->ready(); });
}

Reply ModelService::server_metadata() const {
  return json_reply({{"name", "afterburner"},
                     {"version", options_.server_version()},
                     {"extensions", {"binary_tensor_data"}}});
}

Reply ModelService::model_metadata(std::string_view name) const {
  const Model* model = find(name);
  if (!model) return error_reply(404, fmt::format("unknown model '{}'", name));
  return json_reply({{"name", model->config.name},
                     {"versions", {"1"}},
                     {"platform", "pytorch_torchscript"},
                     {"inputs", tensor_metadata(model->config.inputs)},
                     {"outputs", tensor_metadata(model->config.outputs)}});
}

Reply ModelService::model_ready(std::string_view name) const {
  const Model* model = find(name);
  if (!model) return error_reply(404, fmt::format("unknown model '{}'", name));
  if (!model->batcher->ready()) return error_reply(400, fmt::format("model '{}' is not ready (warming up)", name));
  return json_reply({{"name", model->config.name}, {"ready", true}});
}

void ModelService::infer(std::string_view name, std::string body, std::optional<std::size_t> json_length,
                         ReplyCallback reply) {
  Model* model = find(name);
  if (!model) {
    reply(error_reply(404, fmt::format("unknown model '{}'", name)));
    return;
  }
  auto fail = [model, &reply](int status, const std::string& message) {
    model->metrics.request_failure += 1;
    reply(error_reply(status, message));
  };
  if (std::optional<std::string> refused = model->batcher->refusal()) return fail(503, *refused);
  InferRequest request;
  try {
    request = parse_infer_request(body, json_length, model->config);
  } catch (const RequestError& e) {
    return fail(e.status(), e.what());
  } catch (const std::exception& e) {
    return fail(500, fmt::format("model '{}': {}", name, e.what()));
  }
  std::vector<at::Tensor> inputs = std::move(request.inputs);
  auto encode = [model, request = std::move(request)](const std::vector<at::Tensor>& outputs) {
    return encode_infer_response(model->config, request, outputs);
  };
  submit(*model, std::move(inputs), std::move(encode), std::move(reply));
}

void ModelService::infer_images(std::string_view name, std::vector<std::string> images, int64_t top_k,
                                ReplyCallback reply) {
  Model* model = find(name);
  if (!model) return reply(error_reply(404, fmt::format("unknown model '{}'", name)));
  const ModelConfig& config = model->config;
  auto fail = [model, &reply](int status, const std::string& message) {
    model->metrics.request_failure += 1;
    reply(error_reply(status, message));
  };
  if (!config.image) {
    return fail(415, fmt::format("model '{}' takes tensors: its {} declares no input with format = \"image\"",
                                 name, config.config_file.string()));
  }
  if (static_cast<int64_t>(images.size()) > config.max_batch_size) {
    return fail(400, fmt::format("{} images, more than model '{}' takes at once (max_batch_size {})", images.size(),
                                 name, config.max_batch_size));
  }
  if (std::optional<std::string> refused = model->batcher->refusal()) return fail(503, *refused);
  // Decoding takes milliseconds an image: on LibTorch's inter-op pool, not on the io thread that
  // serves every other connection meanwhile.
  at::launch([this, model, images = std::move(images), top_k, reply = std::move(reply)]() mutable {
    at::Tensor input;
    try {
      input = decode_request_images(model->config, std::move(images));
    } catch (const RequestError& e) {
      model->metrics.request_failure += 1;
      return reply(error_reply(e.status(), e.what()));
    }
    auto encode = [model, top_k](const std::vector<at::Tensor>& outputs) {
      return encode_image_response(model->config, outputs, top_k);
    };
    submit(*model, {input}, std::move(encode), std::move(reply));
  });
}

void ModelService::infer_tensors(std::string_view name, const TensorRequest& tensors, TensorReplyCallback reply) {
  Model* model = find(name);
  auto fail = [model, &reply](int status, std::string message) {
    if (model) model->metrics.request_failure += 1;
    TensorReply failed;
    failed.status = status;
    failed.error = std::move(message);
    reply(std::move(failed));
  };
  if (!model) return fail(404, fmt::format("unknown model '{}'", name));
  if (std::optional<std::string> refused = model->batcher->refusal()) return fail(503, *refused);
  InferRequest request;
  try {
    request = make_infer_request(tensors, model->config);
  } catch (const RequestError& e) {
    return fail(e.status(), e.what());
  }
  std::vector<at::Tensor> inputs = std::move(request.inputs);
  model->batcher->submit(std::move(inputs), [model, request = std::move(request), reply](BatchResult result) {
    TensorReply answer;
    answer.status = result.status;
    answer.error = std::move(result.error);
    answer.model_name = model->config.name;
    answer.id = request.id;
    if (result.status == 200) {
      for (const auto& wanted : request.outputs) {
        const std::size_t index = spec_index(model->config.outputs, wanted.name);
        answer.outputs.emplace_back(wanted.name, result.outputs.at(index).contiguous());
      }
    }
    (result.status == 200 ? model->metrics.request_success : model->metrics.request_failure) += 1;
    reply(std::move(answer));
  });
}

void ModelService::submit(Model& model, std::vector<at::Tensor> inputs,
                          std::function<Reply(const std::vector<at::Tensor>&)> encode, ReplyCallback reply) {
  model.batcher->submit(std::move(inputs), [&model, encode = std::move(encode), reply](BatchResult result) {
    if (result.status != 200) {
      model.metrics.request_failure += 1;
      return reply(error_reply(result.status, result.error));
    }
    Reply encoded;
    try {
      encoded = encode(result.outputs);
    } catch (const std::exception& e) {
      model.metrics.request_failure += 1;
      return reply(error_reply(500, fmt::format("model '{}': {}", model.config.name, e.what())));
    }
    (encoded.status == 200 ? model.metrics.request_success : model.metrics.request_failure) += 1;
    reply(std::move(encoded));
  });
}

std::string ModelService::metrics() const {
  std::vector<std::pair<std::string_view, const ModelMetrics*>> all;
  for (const auto& model : models_) all.emplace_back(model->config.name, &model->metrics);
  return prometheus_text(all);
}

}  // namespace afterburner::serve
