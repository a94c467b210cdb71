// The per-request CPU cost of serving one `cnn` sample: parsing its Open Inference Protocol
// JSON request (simdjson, against nlohmann-json on the same body), encoding the
// response, the binary-extension path, and the batcher's hand-off to a worker and back with a
// model that does nothing. Median [min, max] microseconds over the repetitions.
//
// Two request bodies: afterburner's own encoding (shortest float text) and the one Python's
// json.dumps(tensor.tolist()) writes (float32 values printed as doubles, ~16 KB).
//
//   build-*/bench/bench_serve_codec [repetitions=2000]
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "afterburner/serve/batcher.h"
#include "afterburner/serve/protocol.h"

namespace {

using namespace afterburner::serve;

struct Timing {
  double median_us, min_us, max_us;
};

Timing time_us(int repetitions, const std::function<void()>& run) {
  for (int i = 0; i < 10; ++i) run();  // first-touch allocations, parser buffers
  std::vector<double> samples;
  for (int i = 0; i < repetitions; ++i) {
    auto start = std::chrono::steady_clock::now();
    run();
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples.front(), samples.back()};
}

void report(const std::string& what, const Timing& t) {
  fmt::print("{:<58} {:8.1f} us  [{:.1f}, {:.1f}]\n", what, t.median_us, t.min_us, t.max_us);
}

ModelConfig cnn_config() {
  ModelConfig config;
  config.name = "cnn";
  config.max_batch_size = 64;
  config.inputs = {{"input", DataType::FP32, {1, 28, 28}}};
  config.outputs = {{"output", DataType::FP32, {10}}};
  return config;
}

std::string python_style_body(const at::Tensor& x) {
  std::vector<double> values(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
  return fmt::format(R"({{"inputs": [{{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [{}]}}]}})",
                     fmt::join(values, ", "));
}

void bench_codec(int repetitions) {
  const ModelConfig config = cnn_config();
  const at::Tensor x = torch::rand({1, 1, 28, 28});
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {"afterburner", encode_infer_request({{"input", x}}).body}, {"python json", python_style_body(x)}};
  for (const auto& [style, body] : bodies) {
    std::string label = fmt::format("{} body, {:.1f} KB", style, body.size() / 1024.0);
    report("parse_infer_request (simdjson DOM), " + label, time_us(repetitions, [&] {
             std::string copy = body;  // the service owns the body it parses
             parse_infer_request(copy, std::nullopt, config);
           }));
    report("nlohmann::json::parse, " + label, time_us(repetitions, [&] {
             auto json = nlohmann::json::parse(body);
             auto data = json["inputs"][0]["data"].get<std::vector<float>>();
           }));
  }
  auto binary = encode_infer_request({{"input", x}}, RequestOptions().binary_inputs(true));
  report(fmt::format("parse binary extension, {} bytes", binary.body.size()), time_us(repetitions, [&] {
           std::string copy = binary.body;
           parse_infer_request(copy, binary.json_length, config);
         }));
  std::string body = bodies[0].second;
  const InferRequest request = parse_infer_request(body, std::nullopt, config);
  const std::vector<at::Tensor> outputs = {torch::randn({1, 10})};
  report("encode response [1, 10] JSON", time_us(repetitions, [&] { encode_infer_response(config, request, outputs); }));
}

// submit -> worker -> callback with a model that returns its input: the batcher's own cost.
void bench_batcher(int repetitions) {
  for (bool batching : {true, false}) {
    ModelConfig config = cnn_config();
    config.outputs = {{"output", DataType::FP32, {1, 28, 28}}};
    config.max_batch_size = 1;
    config.dynamic_batching = batching;
    ModelMetrics metrics;
    Batcher batcher(config, {[](const std::vector<at::Tensor>& inputs) { return inputs; }}, metrics);
    batcher.wait_until_ready();
    const at::Tensor x = torch::rand({1, 1, 28, 28});
    report(fmt::format("batcher round trip, identity model, dynamic_batching={}", batching),
           time_us(repetitions, [&] {
             std::promise<void> done;
             batcher.submit({x}, [&done](BatchResult) { done.set_value(); });
             done.get_future().wait();
           }));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 2000;
  at::set_num_threads(1);
  bench_codec(repetitions);
  bench_batcher(repetitions);
}
