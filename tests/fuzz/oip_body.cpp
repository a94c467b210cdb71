// Open Inference Protocol bodies (serve/protocol.h): the server's request parser, then the
// response to what it accepted, and the client's response parser, on the same bytes.
// The input's first line is the Inference-Header-Content-Length (empty: none), the rest the body.
#include <charconv>

#include <torch/torch.h>

#include "afterburner/serve/protocol.h"
#include "fuzz.h"

namespace {

using namespace afterburner::serve;

// Two inputs and two outputs of different datatypes, one with a free dimension.
ModelConfig model_config() {
  ModelConfig config;
  config.name = "fuzz";
  config.max_batch_size = 4;
  config.inputs = {{"input", DataType::FP32, {2, -1}}, {"mask", DataType::BOOL, {3}}};
  config.outputs = {{"output", DataType::FP16, {4}}, {"index", DataType::INT64, {1}}};
  return config;
}

// Outputs of the shapes the config declares, for `batch` samples.
std::vector<at::Tensor> outputs_for(const ModelConfig& config, int64_t batch) {
  std::vector<at::Tensor> outputs;
  for (const auto& spec : config.outputs) {
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), spec.dims.begin(), spec.dims.end());
    outputs.push_back(torch::ones(shape, scalar_type(spec.datatype)));
  }
  return outputs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelConfig config = model_config();
  const std::string input = afterburner::fuzz::bytes(data, size);
  const std::size_t newline = input.find('\n');
  if (newline == std::string::npos) return 0;
  const std::string body = input.substr(newline + 1);
  std::optional<std::size_t> json_length;
  if (newline > 0) {
    std::size_t value = 0;
    auto [end, error] = std::from_chars(input.data(), input.data() + newline, value);
    // The HTTP server answers 400 itself for a length that is no number or over the body.
    if (error != std::errc() || end != input.data() + newline || value > body.size()) return 0;
    json_length = value;
  }
  afterburner::fuzz::expect_clean_errors([&] {
    std::string request_body = body;
    InferRequest request = parse_infer_request(request_body, json_length, config);
    encode_infer_response(config, request, outputs_for(config, request.batch_size));
  });
  afterburner::fuzz::expect_clean_errors([&] { parse_infer_response(body, json_length); });
  return 0;
}
