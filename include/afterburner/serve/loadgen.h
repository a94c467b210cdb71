// HTTP load generator for `afterburner serve`: keep-alive connections driven by one async
// thread, so it takes little of the cores it shares with the server.
//
//   using namespace afterburner::serve;
//   Endpoint server = parse_url("http://127.0.0.1:8000");
//   std::string body = sample_infer_body(http_get(server, "/v2/models/cnn"), /*seed=*/1);
//   LoadResult closed = run_load(LoadOptions(server).target("/v2/models/cnn/infer").body(body).concurrency(64));
//   LoadResult open = run_load(LoadOptions(server).target(...).body(body).concurrency(64).rate(5000));
//   std::cout << closed.requests_per_second << " req/s, p99 " << closed.latency.p99_ms << " ms\n";
//
// Closed loop: each connection sends its next request when the last one is answered. Open loop
// (rate > 0): requests are scheduled at Poisson arrival times, whatever the server does, and
// sent on the first free connection; latency counts from the scheduled time, so a stalled
// server shows up in the percentiles instead of slowing the load (no coordinated omission).
// Against a grpc:// server the requests are KServe v2 ModelInfer calls (closed loop only),
// multiplexed on one HTTP/2 connection per client thread.
// A request unanswered after `timeout` counts as a timeout: its connection is closed, as a client
// giving up would, and opened again for the next request. With threads > 1 the connections (and
// the arrivals) are shared out over that many client threads, for loads one thread cannot drive.
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace afterburner::serve {

enum class Protocol { http, grpc };

struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 8000;
  Protocol protocol = Protocol::http;  // from the URL's scheme
};

// "http://HOST[:PORT][/]" or "grpc://HOST[:PORT]" with HOST an IP address (ports 80 and 8001 if
// none); throws UsageError("--url", ...) otherwise.
Endpoint parse_url(const std::string& url);

// One GET; returns the body of a 200 response, throws afterburner::Error naming the URL otherwise.
std::string http_get(const Endpoint& server, const std::string& target);

// GET /v2/models/{model}'s JSON, asked of a gRPC server (ModelMetadata); throws afterburner::Error
// naming the server and the status otherwise.
std::string grpc_model_metadata(const Endpoint& server, const std::string& model);

// One sample of every input in `model_metadata` (GET /v2/models/{name}): variable dimensions
// (-1) become 1, data uniform in [0, 1) for floating point inputs and in [0, 10) for integer
// ones. Throws UsageError("metadata", ...) when the metadata has no inputs or an unsupported
// datatype.
std::vector<std::pair<std::string, at::Tensor>> sample_inputs(const std::string& model_metadata, std::uint64_t seed);

// sample_inputs as an Open Inference Protocol infer request: JSON, the binary extension (every
// input and output binary; its JSON length is the request's Inference-Header-Content-Length),
// or a serialized gRPC ModelInferRequest (raw contents) for `model`.
std::string sample_infer_body(const std::string& model_metadata, std::uint64_t seed);
std::pair<std::string, std::size_t> sample_binary_body(const std::string& model_metadata, std::uint64_t seed);
std::string sample_grpc_request(const std::string& model, const std::string& model_metadata, std::uint64_t seed);

struct LoadOptions {
  explicit LoadOptions(Endpoint server) : server_(std::move(server)) {}
  TORCH_ARG(Endpoint, server);
  TORCH_ARG(std::string, target) = "/v2/health/live";
  // http: POSTed when not empty (otherwise the requests are GETs), as application/json, or with
  // json_length as the binary extension. A grpc:// server: a serialized inference.ModelInferRequest.
  TORCH_ARG(std::string, body);
  TORCH_ARG(std::optional<std::size_t>, json_length);
  // Connections; in open loop, the most requests outstanding at once.
  TORCH_ARG(int, concurrency) = 1;
  TORCH_ARG(double, duration_seconds) = 10;
  // Requests per second of the Poisson open loop; 0 runs the closed loop.
  TORCH_ARG(double, rate) = 0;
  TORCH_ARG(std::uint64_t, seed) = 1;
  // An answer later than this is a timeout (wrk's --timeout defaults to 2 s; ours is looser).
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(10);
  TORCH_ARG(int, threads) = 1;
};

struct LatencySummary {
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
};

// Nearest-rank percentiles: p-th is the smallest sample with at least p% of samples at or below it.
LatencySummary summarize_latencies(std::vector<double> latencies_ms);

struct LoadResult {
  int concurrency = 0;
  double rate = 0;              // 0 for the closed loop
  double seconds = 0;           // from the first send to the last answer
  std::uint64_t requests = 0;   // answered, whatever the status
  double requests_per_second = 0;
  LatencySummary latency;       // over every answered request
  // The 2xx answers alone: a server shedding load with quick 503s must not hide slow successes.
  std::uint64_t accepted = 0;
  double accepted_per_second = 0;
  LatencySummary accepted_latency;
  std::map<int, std::uint64_t> statuses;
  std::uint64_t timeouts = 0;           // requests given up after `timeout`
  std::uint64_t connection_errors = 0;  // requests lost to a failed or closed connection
};

// Sends requests for duration_seconds (in open loop, those scheduled within it), then waits
// for the answers to those already sent.
LoadResult run_load(const LoadOptions& options);

// The Poisson arrival times (seconds from the start) the open loop uses for these options.
std::vector<double> poisson_arrivals(double rate, double duration_seconds, std::uint64_t seed);

}  // namespace afterburner::serve
