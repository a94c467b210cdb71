#include "afterburner/serve/grpc_server.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include "afterburner/core/error.h"
#include "afterburner/serve/protocol.h"
#include "grpc_runtime.h"
#include "proto/inference.grpc.pb.h"
#include "reply_thread.h"

namespace afterburner::serve {
// Named rather than anonymous: GrpcServer::Impl, which has linkage, holds an InferenceService.
namespace grpc_detail {

namespace pb = ::inference;

// The HTTP status a Service answers with, as the gRPC code clients of the v2 protocol expect.
grpc::Status status_of(int http_status, const std::string& message) {
  switch (http_status) {
    case 200: return grpc::Status::OK;
    case 400:
    case 413:
    case 415: return {grpc::StatusCode::INVALID_ARGUMENT, message};
    case 404: return {grpc::StatusCode::NOT_FOUND, message};
    case 501: return {grpc::StatusCode::UNIMPLEMENTED, message};
    case 503: return {grpc::StatusCode::UNAVAILABLE, message};
    case 504: return {grpc::StatusCode::DEADLINE_EXCEEDED, message};
    default: return {grpc::StatusCode::INTERNAL, message};
  }
}

// A Service's JSON reply, parsed; a non-200 reply becomes the status it stands for.
std::optional<nlohmann::json> json_of(const Reply& reply, grpc::Status& status) {
  auto body = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (reply.status != 200) {
    const bool has_error = body.is_object() && body.contains("error") && body["error"].is_string();
    status = status_of(reply.status, has_error ? body["error"].get<std::string>() : reply.body);
    return std::nullopt;
  }
  if (body.is_discarded()) {
    status = {grpc::StatusCode::INTERNAL, "the service's reply is not JSON"};
    return std::nullopt;
  }
  return body;
}

// Typed values of type V as the little-endian elements T of `datatype`; an integer that T cannot
// hold is refused.
template <typename T, typename Values>
std::string elements_as_bytes(const Values& values, const std::string& where) {
  std::string bytes(static_cast<std::size_t>(values.size()) * sizeof(T), '\0');
  auto* out = reinterpret_cast<T*>(bytes.data());
  for (int i = 0; i < values.size(); ++i) {
    using V = std::decay_t<decltype(values[i])>;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) < sizeof(V)) {
      if (values[i] < std::numeric_limits<T>::lowest() || values[i] > std::numeric_limits<T>::max()) {
        throw RequestError(400, fmt::format("{}: value {} out of range of its datatype", where, values[i]));
      }
    }
    out[i] = static_cast<T>(values[i]);
  }
  return bytes;
}

// An input's typed `contents` as the bytes its raw_input_contents would hold.
std::string contents_as_bytes(const pb::ModelInferRequest::InferInputTensor& input, const std::string& where) {
  const pb::InferTensorContents& contents = input.contents();
  const std::optional<DataType> datatype = parse_datatype(input.datatype());
  if (!datatype) return {};  // make_infer_request names the datatype
  switch (*datatype) {
    case DataType::BOOL: return elements_as_bytes<bool>(contents.bool_contents(), where);
    case DataType::UINT8: return elements_as_bytes<uint8_t>(contents.uint_contents(), where);
    case DataType::INT8: return elements_as_bytes<int8_t>(contents.int_contents(), where);
    case DataType::INT16: return elements_as_bytes<int16_t>(contents.int_contents(), where);
    case DataType::INT32: return elements_as_bytes<int32_t>(contents.int_contents(), where);
    case DataType::INT64: return elements_as_bytes<int64_t>(contents.int64_contents(), where);
    case DataType::FP32: return elements_as_bytes<float>(contents.fp32_contents(), where);
    case DataType::FP64: return elements_as_bytes<double>(contents.fp64_contents(), where);
    case DataType::FP16: break;
  }
  throw RequestError(400, where + ": FP16 has no typed contents; send it as raw_input_contents");
}

// The request's tensors, as views of its raw contents or of the bytes of its typed contents
// (kept in `owned`, which must outlive the result).
TensorRequest tensor_request(const pb::ModelInferRequest& request, std::vector<std::string>& owned) {
  const int inputs = request.inputs_size();
  const int raw = request.raw_input_contents_size();
  if (raw != 0 && raw != inputs) {
    throw RequestError(400, fmt::format("raw_input_contents holds {} entries for {} inputs", raw, inputs));
  }
  TensorRequest tensors;
  tensors.id = request.id();
  owned.reserve(static_cast<std::size_t>(inputs));  // the views below point into it
  for (int i = 0; i < inputs; ++i) {
    const auto& input = request.inputs(i);
    const std::string where = fmt::format("inputs[{}]", i);
    if (raw != 0 && input.has_contents()) {
      throw RequestError(400, where + ": both contents and raw_input_contents; send one or the other");
    }
    RawTensor tensor{input.name(), input.datatype(), {input.shape().begin(), input.shape().end()}, {}};
    if (raw != 0) {
      tensor.bytes = request.raw_input_contents(i);
    } else {
      tensor.bytes = owned.emplace_back(contents_as_bytes(input, where));
    }
    tensors.inputs.push_back(std::move(tensor));
  }
  for (const auto& output : request.outputs()) tensors.outputs.push_back(output.name());
  return tensors;
}

void fill_response(TensorReply& reply, pb::ModelInferResponse& response) {
  response.set_model_name(reply.model_name);
  response.set_model_version(reply.model_version);
  response.set_id(reply.id);
  for (const auto& [name, tensor] : reply.outputs) {
    auto* output = response.add_outputs();
    output->set_name(name);
    output->set_datatype(std::string(datatype_name(datatype_of(tensor.scalar_type()))));
    for (const int64_t size : tensor.sizes()) output->add_shape(size);
    response.add_raw_output_contents()->assign(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  }
}

void set_metadata(const nlohmann::json& tensor, pb::ModelMetadataResponse::TensorMetadata& out) {
  out.set_name(tensor.value("name", ""));
  out.set_datatype(tensor.value("datatype", ""));
  for (const auto& size : tensor.value("shape", nlohmann::json::array())) out.add_shape(size.get<int64_t>());
}

class InferenceService final : public pb::GRPCInferenceService::CallbackService {
 public:
  // (serve::Service: inside this class, plain `Service` names a base of the generated code.)
  explicit InferenceService(serve::Service& service) : service_(service) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context, const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* response) override {
    response->set_live(service_.live());
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context, const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* response) override {
    response->set_ready(service_.ready());
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context, const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* response) override {
    grpc::Status status;
    if (auto metadata = json_of(service_.server_metadata(), status)) {
      response->set_name(metadata->value("name", ""));
      response->set_version(metadata->value("version", ""));
      for (const auto& extension : metadata->value("extensions", nlohmann::json::array())) {
        response->add_extensions(extension.get<std::string>());
      }
    }
    return finished(context, status);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context, const pb::ModelReadyRequest* request,
                                       pb::ModelReadyResponse* response) override {
    const Reply reply = service_.model_ready({request->name(), request->version()});
    if (reply.status == 404) {
      grpc::Status status;
      json_of(reply, status);
      return finished(context, status);
    }
    response->set_ready(reply.status == 200);  // otherwise still warming up
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const pb::ModelMetadataRequest* request,
                                          pb::ModelMetadataResponse* response) override {
    grpc::Status status;
    if (auto metadata = json_of(service_.model_metadata({request->name(), request->version()}), status)) {
      response->set_name(metadata->value("name", ""));
      for (const auto& version : metadata->value("versions", nlohmann::json::array())) {
        response->add_versions(version.get<std::string>());
      }
      response->set_platform(metadata->value("platform", ""));
      for (const auto& input : metadata->value("inputs", nlohmann::json::array())) {
        set_metadata(input, *response->add_inputs());
      }
      for (const auto& output : metadata->value("outputs", nlohmann::json::array())) {
        set_metadata(output, *response->add_outputs());
      }
    }
    return finished(context, status);
  }

  // Answered once the batch has run, on the reply thread (a refusal at once, here); gRPC keeps
  // `response` until then.
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context, const pb::ModelInferRequest* request,
                                       pb::ModelInferResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::vector<std::string> owned;
    TensorRequest tensors;
    try {
      tensors = tensor_request(*request, owned);
    } catch (const RequestError& e) {
      reactor->Finish(status_of(e.status(), e.what()));
      return reactor;
    }
    service_.infer_tensors({request->model_name(), request->model_version()}, tensors,
                           [this, reactor, response, asker = std::this_thread::get_id()](TensorReply reply) {
                             replies_.answer(asker, [reactor, response, reply = std::move(reply)]() mutable {
                               answer(reply, *response, *reactor);
                             });
                           });
    return reactor;
  }

 private:
  static void answer(TensorReply& reply, pb::ModelInferResponse& response, grpc::ServerUnaryReactor& reactor) {
    if (reply.status != 200) return reactor.Finish(status_of(reply.status, reply.error));
    try {
      fill_response(reply, response);
    } catch (const std::exception& e) {  // an output of a type the protocol has no datatype for
      return reactor.Finish(
          grpc::Status(grpc::StatusCode::INTERNAL, fmt::format("model '{}': {}", reply.model_name, e.what())));
    }
    reactor.Finish(grpc::Status::OK);
  }

  static grpc::ServerUnaryReactor* finished(grpc::CallbackServerContext* context, const grpc::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  serve::Service& service_;
  // Outlives the gRPC server's Shutdown, which waits for the calls it still has to answer.
  detail::ReplyThread replies_;
};

}  // namespace grpc_detail

struct GrpcServer::Impl {
  Impl(Service& service, const GrpcOptions& options) : inference(service) {
    if (options.port() < 0 || options.port() > 65535) {
      throw UsageError("grpc port", std::to_string(options.port()) + " is not a port number (0-65535)");
    }
    detail::use_release_mode_abseil();
    const bool ipv6 = options.host().find(':') != std::string::npos;
    const std::string where = (ipv6 ? "[" + options.host() + "]" : options.host()) + ":" + std::to_string(options.port());
    grpc::ServerBuilder builder;
    builder.AddListeningPort(where, grpc::InsecureServerCredentials(), &port);
    // gRPC would otherwise share a port another server already listens on (SO_REUSEPORT).
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<std::size_t>(options.max_message_bytes(),
                                                                            std::numeric_limits<int>::max())));
    builder.RegisterService(&inference);
    server = builder.BuildAndStart();
    if (!server || port == 0) throw Error(where + ": cannot listen for gRPC");
  }

  void stop() {
    std::call_once(stopped, [this] { server->Shutdown(); });
  }

  grpc_detail::InferenceService inference;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::once_flag stopped;
};

GrpcServer::GrpcServer(Service& service, GrpcOptions options) : impl_(std::make_unique<Impl>(service, options)) {}

GrpcServer::~GrpcServer() { stop(); }

int GrpcServer::port() const { return impl_->port; }

void GrpcServer::stop() { impl_->stop(); }

}  // namespace afterburner::serve
