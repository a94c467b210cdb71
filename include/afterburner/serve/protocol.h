// Open Inference Protocol v2 inference bodies, JSON and the binary tensor extension: the
// server side (parse a request against a model's config, encode its response) and the client
// side (encode a request, parse a response) that the load generator and the tests use.
//
//   auto request = afterburner::serve::parse_infer_request(body, json_length, config);
//   std::vector<at::Tensor> outputs = run(request.inputs);          // config output order
//   Reply reply = afterburner::serve::encode_infer_response(config, request, outputs);
//
// JSON tensors: {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [...]},
// data flat or nested, row-major. Binary: "parameters": {"binary_data_size": N} on an input
// instead of "data", its bytes after the JSON (Inference-Header-Content-Length bytes long) in
// input order; an output comes back binary for "parameters": {"binary_data": true} on it in
// "outputs", or for every output with the request parameter "binary_data_output": true.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/serve/repository.h"
#include "afterburner/serve/service.h"

namespace afterburner::serve {

// A request the server answers with `status` (400 bad request, 404 unknown model, 503 overload,
// 504 timed out) and {"error": what()}.
class RequestError : public Error {
 public:
  RequestError(int status, const std::string& message) : Error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

struct OutputRequest {
  std::string name;
  bool binary = false;
};

struct InferRequest {
  std::string id;                      // echoed in the response; empty if the request had none
  std::vector<at::Tensor> inputs;      // in the config's input order, batch dimension first
  int64_t batch_size = 0;              // samples, the same for every input
  std::vector<OutputRequest> outputs;  // in the config's output order
};

// Checks names, datatypes, shapes (batch first, then the config's dims, batch at most
// max_batch_size) and that data or binary sizes match the shapes. Pads `body` in place for the
// JSON parser (its capacity may grow). Throws RequestError(400) naming the input or field.
InferRequest parse_infer_request(std::string& body, std::optional<std::size_t> json_length,
                                 const ModelConfig& config);

// The same checks for a request whose tensors come as bytes (gRPC): names, datatypes, shapes,
// byte sizes, the outputs asked for. Throws RequestError(400) naming the input or output.
InferRequest make_infer_request(const TensorRequest& request, const ModelConfig& config);

// {"model_name", "id", "outputs": [...]}; binary outputs follow the JSON, whose length the reply
// carries in its Inference-Header-Content-Length header. `outputs` in the config's output order.
Reply encode_infer_response(const ModelConfig& config, const InferRequest& request,
                            const std::vector<at::Tensor>& outputs);

// The LibTorch element type of a datatype, and back (throws Error for a type with no datatype).
at::ScalarType scalar_type(DataType type);
DataType datatype_of(at::ScalarType type);

// {"error": message} with the given status.
Reply error_reply(int status, std::string_view message);

using NamedTensor = std::pair<std::string, at::Tensor>;

struct RequestOptions {
  TORCH_ARG(std::string, id);
  TORCH_ARG(bool, binary_inputs) = false;   // inputs as binary data after the JSON
  TORCH_ARG(bool, binary_outputs) = false;  // asks for every output in binary
};

struct EncodedBody {
  std::string body;
  std::optional<std::size_t> json_length;  // set when binary data follows the JSON
};

// The client side: a request body for `inputs` (contiguous or not, any supported dtype).
EncodedBody encode_infer_request(const std::vector<NamedTensor>& inputs, const RequestOptions& options = {});

// The client side: the outputs of a response body, JSON or binary. Throws RequestError(400)
// for a malformed body.
std::vector<NamedTensor> parse_infer_response(std::string body, std::optional<std::size_t> json_length);

}  // namespace afterburner::serve
