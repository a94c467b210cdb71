// The seam between the protocol front ends and the models: one call per Open Inference Protocol
// v2 route. The HTTP server (serve/http_server.h) parses requests and writes replies and never
// looks inside a tensor; the gRPC server (serve/grpc_server.h) hands tensors over as bytes
// (infer_tensors); a Service (serve/model_service.h) owns the models, the batchers and the
// metrics and never touches a socket.
//
//   afterburner::serve::ModelService models(afterburner::serve::load_repository("models/"));
//   afterburner::serve::HttpServer server(models, afterburner::serve::HttpOptions().port(8000));
//   server.run();                       // until stop() or SIGTERM
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace afterburner::serve {

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;  // errors: {"error": "<one line>"}
  std::vector<std::pair<std::string, std::string>> headers;  // e.g. Inference-Header-Content-Length
};

// Called exactly once per request, possibly from another thread.
using ReplyCallback = std::function<void(Reply)>;

// An input tensor as bytes: its elements flattened, row-major, little-endian.
struct RawTensor {
  std::string name;
  std::string datatype;  // "FP32", "INT64", ...
  std::vector<int64_t> shape;
  std::string_view bytes;
};

// An inference request whose tensors arrive as bytes, not in an HTTP body (gRPC's ModelInfer).
struct TensorRequest {
  std::string id;                    // echoed in the reply
  std::vector<RawTensor> inputs;
  std::vector<std::string> outputs;  // the outputs wanted, in the model's order; empty: all
};

struct TensorReply {
  int status = 200;  // else an HTTP status (400, 404, 503, 504, 500, 501) with `error`
  std::string error;
  std::string model_name;
  std::string model_version;
  std::string id;
  std::vector<std::pair<std::string, at::Tensor>> outputs;  // contiguous, in the model's order
};

using TensorReplyCallback = std::function<void(TensorReply)>;

// A model as a request names it, /v2/models/{name}[/versions/{version}]: an empty version is
// the one the server serves.
struct ModelRef {
  ModelRef(std::string_view name, std::string_view version = {}) : name(name), version(version) {}
  ModelRef(const char* name) : name(name) {}
  ModelRef(const std::string& name) : name(name) {}

  std::string_view name;
  std::string_view version;
};

class Service {
 public:
  virtual ~Service() = default;

  virtual bool live() const = 0;
  virtual bool ready() const = 0;  // every model loaded and warmed up
  virtual Reply server_metadata() const = 0;                      // GET /v2
  virtual Reply model_metadata(ModelRef model) const = 0;  // GET /v2/models/{name}
  virtual Reply model_ready(ModelRef model) const = 0;     // GET /v2/models/{name}/ready
  // POST /v2/models/{name}/infer. `json_length` is the Inference-Header-Content-Length header
  // (binary tensor extension): the JSON part is body[0, json_length), binary data follows.
  virtual void infer(ModelRef model, std::string body, std::optional<std::size_t> json_length,
                     ReplyCallback reply) = 0;
  // POST /v2/models/{name}/infer with encoded images (an image/* body, or multipart/form-data
  // parts) for a model with an image input (serve/image_input.h), answering each image's top_k
  // classes. A service without image inputs answers 415.
  virtual void infer_images(ModelRef model, std::vector<std::string> images, int64_t top_k, ReplyCallback reply);
  // ModelInfer over gRPC. The request's bytes are read before this returns. A service that
  // does not override it answers 501.
  virtual void infer_tensors(ModelRef model, const TensorRequest& request, TensorReplyCallback reply);
  virtual std::string metrics() const = 0;  // GET /metrics, Prometheus text format

  // Model control (Triton's repository extension). POST /v2/repository/index: the repository's
  // models and their states; a body {"ready": true} lists the ready ones only.
  virtual Reply repository_index(std::string_view body) const;
  // POST /v2/repository/models/{name}/load and .../unload, answered once done. A service that
  // does not override them answers 501.
  virtual void load_model(std::string_view model, ReplyCallback reply);
  virtual void unload_model(std::string_view model, ReplyCallback reply);

  // GET /dashboard: a page that plots the service live (monitor/dashboard.h); by default the
  // serving dashboard, drawn from /metrics.
  virtual Reply dashboard() const;
  // GET /dashboard/data: the JSON a dashboard that does not read /metrics fetches; 404 by default.
  virtual Reply dashboard_data() const;
};

}  // namespace afterburner::serve
