// afterburner loadgen: closed-loop concurrency sweep (or Poisson open loop) against a server
// speaking the Open Inference Protocol, reporting throughput and latency percentiles.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>
#include <memory>
#include <optional>

#include "afterburner/core/error.h"
#include "afterburner/serve/loadgen.h"
#include "commands.h"
#include "options.h"

namespace afterburner::tools {
namespace {

struct LoadgenArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string model;
  std::vector<int> concurrency{1, 8, 64};
  double duration = 10;
  double rate = 0;
  std::string input;
  std::uint64_t seed = 1;
  double timeout = 10;
  int threads = 1;
  bool binary = false;
  bool json = false;
};

struct RequestBody {
  std::string bytes;
  std::optional<std::size_t> json_length;  // the binary extension's
};

RequestBody request_body(const LoadgenArgs& args, const serve::Endpoint& server) {
  const bool grpc = server.protocol == serve::Protocol::grpc;
  if (args.binary && grpc) throw UsageError("--binary", "is for http:// servers (gRPC requests carry raw bytes)");
  if (!args.input.empty()) {
    if (args.binary) throw UsageError("--binary", "applies to generated samples, not to --input");
    if (!std::filesystem::is_regular_file(args.input)) throw DataError(args.input, "no such request body file");
    std::ifstream in(args.input, std::ios::binary);
    return {std::string(std::istreambuf_iterator<char>(in), {}), std::nullopt};
  }
  if (grpc) return {serve::sample_grpc_request(args.model, serve::grpc_model_metadata(server, args.model), args.seed), {}};
  const std::string metadata = serve::http_get(server, "/v2/models/" + args.model);
  if (!args.binary) return {serve::sample_infer_body(metadata, args.seed), std::nullopt};
  auto [bytes, json_length] = serve::sample_binary_body(metadata, args.seed);
  return {std::move(bytes), json_length};
}

std::string statuses_text(const serve::LoadResult& result) {
  std::string text;
  for (auto [status, count] : result.statuses) text += fmt::format(" {}={}", status, count);
  if (result.timeouts > 0) text += fmt::format(" timeouts={}", result.timeouts);
  if (result.connection_errors > 0) text += fmt::format(" connection_errors={}", result.connection_errors);
  return text;
}

nlohmann::json result_json(const serve::LoadResult& result) {
  nlohmann::json statuses = nlohmann::json::object();
  for (auto [status, count] : result.statuses) statuses[std::to_string(status)] = count;
  return {{"concurrency", result.concurrency}, {"rate", result.rate}, {"seconds", result.seconds},
          {"requests", result.requests}, {"requests_per_second", result.requests_per_second},
          {"p50_ms", result.latency.p50_ms}, {"p90_ms", result.latency.p90_ms}, {"p99_ms", result.latency.p99_ms},
          {"max_ms", result.latency.max_ms}, {"accepted", result.accepted},
          {"accepted_per_second", result.accepted_per_second}, {"accepted_p50_ms", result.accepted_latency.p50_ms},
          {"accepted_p99_ms", result.accepted_latency.p99_ms}, {"statuses", statuses}, {"timeouts", result.timeouts},
          {"connection_errors", result.connection_errors}};
}

int loadgen(const LoadgenArgs& args) {
  serve::Endpoint server = serve::parse_url(args.url);
  const RequestBody body = request_body(args, server);
  const std::string target = "/v2/models/" + args.model + "/infer";
  nlohmann::json report = nlohmann::json::array();
  if (!args.json) {
    std::cout << fmt::format("{:>11} {:>8} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>10} {:>9} {:>9}  statuses\n",
                             "concurrency", "rate", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "2xx/s",
                             "2xx p50", "2xx p99");
  }
  for (int concurrency : args.concurrency) {
    serve::LoadResult result = serve::run_load(serve::LoadOptions(server)
                                                   .target(target)
                                                   .body(body.bytes)
                                                   .json_length(body.json_length)
                                                   .concurrency(concurrency)
                                                   .duration_seconds(args.duration)
                                                   .rate(args.rate)
                                                   .seed(args.seed)
                                                   .timeout(std::chrono::milliseconds(std::lround(args.timeout * 1000)))
                                                   .threads(args.threads));
    if (args.json) {
      report.push_back(result_json(result));
      continue;
    }
    std::cout << fmt::format("{:>11} {:>8} {:>9} {:>10.0f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>10.0f} {:>9.2f} {:>9.2f} {}\n",
                             concurrency, args.rate > 0 ? fmt::format("{:.0f}", args.rate) : "closed", result.requests,
                             result.requests_per_second, result.latency.p50_ms, result.latency.p90_ms,
                             result.latency.p99_ms, result.latency.max_ms, result.accepted_per_second,
                             result.accepted_latency.p50_ms, result.accepted_latency.p99_ms, statuses_text(result))
              << std::flush;
  }
  if (args.json) std::cout << report.dump(2) << "\n";
  return 0;
}

}  // namespace

Command add_loadgen_command(CLI::App& app) {
  auto* sub = app.add_subcommand("loadgen", "load an inference server: throughput and latency percentiles");
  auto args = std::make_shared<LoadgenArgs>();
  sub->add_option("--url", args->url, "server, http://IP[:PORT], or grpc://IP[:PORT] for gRPC's ModelInfer")
      ->capture_default_str();
  sub->add_option("--model", args->model, "model to infer with")->required();
  add_list_option(sub, "--concurrency", args->concurrency, "connections, one run each");
  sub->add_option("--duration", args->duration, "seconds per run")->capture_default_str();
  sub->add_option("--rate", args->rate, "requests/s of a Poisson open loop (default: closed loop)");
  sub->add_option("--input", args->input, "request body file (default: one random sample from the model's metadata)");
  sub->add_option("--seed", args->seed, "seed of the random sample and the arrivals")->capture_default_str();
  sub->add_option("--timeout", args->timeout, "seconds after which an unanswered request is a timeout")
      ->capture_default_str();
  sub->add_option("--threads", args->threads, "client threads sharing the connections")->capture_default_str();
  sub->add_flag("--binary", args->binary, "send and ask for tensors in the binary extension instead of JSON");
  sub->add_flag("--json", args->json, "print the results as JSON");
  return {sub, [args] { return loadgen(*args); }};
}

}  // namespace afterburner::tools
