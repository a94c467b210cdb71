#include "afterburner/serve/loadgen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "afterburner/core/error.h"
#include "afterburner/models/zoo.h"
#include "afterburner/serve/grpc_server.h"
#include "afterburner/serve/http_server.h"
#include "cnn_repository.h"
#include "proto/inference.pb.h"
#include "running_server.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::serve::testing::RunningServer;

Endpoint endpoint_of(const RunningServer& server) { return {"127.0.0.1", server.port()}; }

using afterburner::testing::Contains;
using afterburner::testing::error_message;
using afterburner::testing::TempDir;
using namespace std::chrono_literals;

// Answers every infer after `delay` from its own thread, in arrival order; every `reject_every`-th
// request gets a 503. Counts what it answered.
class DelayService : public Service {
 public:
  explicit DelayService(std::chrono::milliseconds delay, int reject_every = 0)
      : delay_(delay), reject_every_(reject_every), replier_([this] { reply_loop(); }) {}
  ~DelayService() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    changed_.notify_all();
    replier_.join();
  }

  bool live() const override { return true; }
  bool ready() const override { return true; }
  Reply server_metadata() const override { return {}; }
  Reply model_metadata(ModelRef) const override {
    return {200, "application/json", R"({"name":"m","inputs":[{"name":"x","datatype":"FP32","shape":[-1,2]}]})", {}};
  }
  Reply model_ready(ModelRef) const override { return {}; }
  void infer(ModelRef, std::string, std::optional<std::size_t>, ReplyCallback reply) override {
    enqueue([reply = std::move(reply)](bool reject) {
      reply(reject ? Reply{503, "application/json", R"({"error":"busy"})", {}} : Reply{});
    });
  }
  void infer_tensors(ModelRef, const TensorRequest&, TensorReplyCallback reply) override {
    enqueue([reply = std::move(reply)](bool reject) {
      TensorReply answer;
      answer.status = reject ? 503 : 200;
      reply(std::move(answer));
    });
  }
  std::string metrics() const override { return ""; }

  std::uint64_t answered() const { return answered_; }
  std::uint64_t rejected() const { return rejected_; }

 private:
  struct Pending {
    std::chrono::steady_clock::time_point due;
    std::function<void(bool reject)> answer;
  };

  void enqueue(std::function<void(bool reject)> answer) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::chrono::steady_clock::now() + delay_, std::move(answer)});
    changed_.notify_all();
  }

  void reply_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Pending next = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(next.due);
      bool reject = reject_every_ > 0 && (answered_ + 1) % reject_every_ == 0;
      rejected_ += reject;
      ++answered_;
      next.answer(reject);
      lock.lock();
    }
  }

  const std::chrono::milliseconds delay_;
  const int reject_every_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Pending> queue_;
  bool closing_ = false;
  std::atomic<std::uint64_t> answered_{0}, rejected_{0};
  std::thread replier_;  // last: starts once the rest is built
};

TEST(Loadgen, PercentilesAreNearestRank) {
  std::vector<double> samples(100);
  std::iota(samples.begin(), samples.end(), 1.0);
  std::shuffle(samples.begin(), samples.end(), std::mt19937(3));
  LatencySummary summary = summarize_latencies(samples);
  EXPECT_EQ(summary.p50_ms, 50);
  EXPECT_EQ(summary.p90_ms, 90);
  EXPECT_EQ(summary.p99_ms, 99);
  EXPECT_EQ(summary.max_ms, 100);
  LatencySummary ten = summarize_latencies({5, 1, 4, 2, 3, 10, 9, 8, 7, 6});
  EXPECT_EQ(ten.p50_ms, 5);
  EXPECT_EQ(ten.p90_ms, 9);
  EXPECT_EQ(ten.p99_ms, 10);
  LatencySummary one = summarize_latencies({7});
  EXPECT_EQ(one.p50_ms, 7);
  EXPECT_EQ(one.max_ms, 7);
  EXPECT_EQ(summarize_latencies({}).p99_ms, 0);
}

TEST(Loadgen, ParsesUrls) {
  Endpoint plain = parse_url("http://127.0.0.1:8123");
  EXPECT_EQ(plain.host, "127.0.0.1");
  EXPECT_EQ(plain.port, 8123);
  EXPECT_EQ(parse_url("http://10.0.0.2/").port, 80);
  EXPECT_EQ(plain.protocol, Protocol::http);
  Endpoint grpc = parse_url("grpc://127.0.0.1:9001");
  EXPECT_EQ(grpc.port, 9001);
  EXPECT_EQ(grpc.protocol, Protocol::grpc);
  EXPECT_EQ(parse_url("grpc://10.0.0.2").port, 8001);
  for (std::string bad : {"127.0.0.1:8000", "http://localhost:8000", "http://127.0.0.1:", "http://127.0.0.1:99999",
                          "http://127.0.0.1:80a"}) {
    EXPECT_TRUE(Contains(error_message<UsageError>([&] { parse_url(bad); }), "--url: '" + bad + "'")) << bad;
  }
}

TEST(Loadgen, SampleBodyFollowsTheMetadata) {
  std::string metadata = R"({"name":"cnn","inputs":[{"name":"image","datatype":"FP32","shape":[-1,1,2,3]},
                                                    {"name":"ids","datatype":"INT64","shape":[4]}]})";
  auto body = nlohmann::json::parse(sample_infer_body(metadata, 5));
  ASSERT_EQ(body["inputs"].size(), 2u);
  const auto& image = body["inputs"][0];
  EXPECT_EQ(image["name"], "image");
  EXPECT_EQ(image["datatype"], "FP32");
  EXPECT_EQ(image["shape"], nlohmann::json({1, 1, 2, 3}));
  ASSERT_EQ(image["data"].size(), 6u);
  for (const auto& x : image["data"]) EXPECT_TRUE(x.is_number_float() && x >= 0 && x < 1);
  const auto& ids = body["inputs"][1];
  ASSERT_EQ(ids["data"].size(), 4u);
  for (const auto& x : ids["data"]) EXPECT_TRUE(x.is_number_integer() && x >= 0 && x < 10);
  EXPECT_EQ(sample_infer_body(metadata, 5), sample_infer_body(metadata, 5));
  EXPECT_NE(sample_infer_body(metadata, 5), sample_infer_body(metadata, 6));
}

// The binary and gRPC samples carry sample_inputs' bytes, as the JSON one carries its values.
TEST(Loadgen, BinaryAndGrpcSamplesCarryTheSampleInputs) {
  const std::string metadata = R"({"name":"cnn","inputs":[{"name":"image","datatype":"FP32","shape":[-1,1,2,3]},
                                                           {"name":"ids","datatype":"INT64","shape":[4]}]})";
  const auto inputs = sample_inputs(metadata, 5);
  ASSERT_EQ(inputs.size(), 2u);
  const auto bytes_of = [](const at::Tensor& t) { return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()); };
  const auto [binary, json_length] = sample_binary_body(metadata, 5);
  EXPECT_EQ(binary.substr(json_length), bytes_of(inputs[0].second) + bytes_of(inputs[1].second));
  const auto json = nlohmann::json::parse(binary.substr(0, json_length));
  EXPECT_EQ(json["inputs"][1]["parameters"]["binary_data_size"], 32);
  EXPECT_EQ(json["parameters"]["binary_data_output"], true);

  inference::ModelInferRequest grpc;
  ASSERT_TRUE(grpc.ParseFromString(sample_grpc_request("cnn", metadata, 5)));
  EXPECT_EQ(grpc.model_name(), "cnn");
  ASSERT_EQ(grpc.inputs_size(), 2);
  EXPECT_EQ(grpc.inputs(1).name(), "ids");
  EXPECT_EQ(grpc.inputs(1).datatype(), "INT64");
  EXPECT_EQ(std::vector<int64_t>(grpc.inputs(0).shape().begin(), grpc.inputs(0).shape().end()),
            (std::vector<int64_t>{1, 1, 2, 3}));
  ASSERT_EQ(grpc.raw_input_contents_size(), 2);
  EXPECT_EQ(grpc.raw_input_contents(0), bytes_of(inputs[0].second));
  EXPECT_EQ(grpc.raw_input_contents(1), bytes_of(inputs[1].second));
}

TEST(Loadgen, UnusableMetadataNamesTheProblem) {
  EXPECT_EQ(error_message<UsageError>([] { sample_infer_body("{", 1); }), "metadata: not JSON");
  EXPECT_EQ(error_message<UsageError>([] { sample_infer_body(R"({"inputs":[]})", 1); }), "metadata: no inputs");
  EXPECT_TRUE(Contains(error_message<UsageError>([] {
                         sample_infer_body(R"({"inputs":[{"name":"s","datatype":"BYTES","shape":[1]}]})", 1);
                       }),
                       "metadata: datatype BYTES cannot be generated"));
}

TEST(Loadgen, HttpGetReturnsTheBodyOrNamesTheUrl) {
  DelayService service(0ms);
  RunningServer server(service);
  EXPECT_TRUE(Contains(http_get(endpoint_of(server), "/v2/models/m"), R"("datatype":"FP32")"));
  std::string url = "http://127.0.0.1:" + std::to_string(endpoint_of(server).port) + "/nowhere";
  EXPECT_TRUE(Contains(error_message<Error>([&] { http_get(endpoint_of(server), "/nowhere"); }), url + ": status 404: "));
}

TEST(Loadgen, ClosedLoopCountsEveryAnswerByStatus) {
  DelayService service(1ms, /*reject_every=*/4);
  RunningServer server(service);
  LoadResult result = run_load(LoadOptions(endpoint_of(server)).target("/v2/models/m/infer").body("{}").concurrency(3).duration_seconds(0.3));
  ASSERT_GT(result.requests, 0u);
  EXPECT_EQ(result.requests, service.answered());
  EXPECT_EQ(result.statuses[503], service.rejected());
  EXPECT_EQ(result.statuses[200], service.answered() - service.rejected());
  EXPECT_EQ(result.statuses.size(), 2u);
  EXPECT_EQ(result.connection_errors, 0u);
  EXPECT_EQ(result.timeouts, 0u);
  EXPECT_EQ(result.concurrency, 3);
  EXPECT_DOUBLE_EQ(result.requests_per_second, result.requests / result.seconds);
  EXPECT_EQ(result.accepted, result.statuses[200]);
  EXPECT_DOUBLE_EQ(result.accepted_per_second, result.accepted / result.seconds);
}

// Quick 503s must not hide slow successes: the service answers one request in three 200 after
// 30 ms, the others 503 at once.
TEST(Loadgen, AcceptedLatencyLeavesOutTheRejections) {
  class SlowAccepts : public DelayService {
   public:
    SlowAccepts() : DelayService(0ms) {}
    void infer(ModelRef model, std::string body, std::optional<std::size_t> length, ReplyCallback reply) override {
      if (++calls_ % 3 != 1) return reply(Reply{503, "application/json", R"({"error":"busy"})", {}});
      std::this_thread::sleep_for(30ms);  // the io thread: one request at a time
      DelayService::infer(model, std::move(body), length, std::move(reply));
    }

   private:
    std::atomic<int> calls_{0};
  } service;
  RunningServer server(service);
  LoadResult result = run_load(LoadOptions(endpoint_of(server)).target("/v2/models/m/infer").body("{}").duration_seconds(0.4));
  ASSERT_GE(result.accepted, 3u);
  ASSERT_GE(result.statuses[503], 3u);
  EXPECT_GE(result.accepted_latency.p50_ms, 30);
  // Two answers in three are immediate 503s: the median of all answers is one of them.
  EXPECT_GT(result.accepted_latency.p50_ms, result.latency.p50_ms);
}

// A 300 ms service and a 50 ms timeout: each request is given up, its connection closed and a
// new one opened for the next; none is an answer or a connection error.
TEST(Loadgen, UnansweredRequestsTimeOut) {
  DelayService service(300ms);
  RunningServer server(service);
  LoadResult result = run_load(LoadOptions(endpoint_of(server))
                                   .target("/v2/models/m/infer")
                                   .body("{}")
                                   .concurrency(2)
                                   .duration_seconds(0.2)
                                   .timeout(50ms));
  EXPECT_EQ(result.requests, 0u);
  EXPECT_GE(result.timeouts, 4u);  // two connections, each giving up every 50 ms for 0.2 s
  EXPECT_LE(result.timeouts, 10u);
  EXPECT_EQ(result.connection_errors, 0u);
}

TEST(Loadgen, ThreadsShareTheConnectionsAndTheArrivals) {
  DelayService service(0ms);
  RunningServer server(service);
  LoadResult closed = run_load(
      LoadOptions(endpoint_of(server)).target("/v2/models/m/infer").body("{}").concurrency(5).threads(2).duration_seconds(0.3));
  EXPECT_GT(closed.requests, 0u);
  EXPECT_EQ(closed.requests, service.answered());
  EXPECT_EQ(closed.concurrency, 5);
  const std::uint64_t before = service.answered();
  LoadResult open = run_load(LoadOptions(endpoint_of(server)).concurrency(4).threads(2).duration_seconds(0.5).rate(400).seed(3));
  // Each thread draws the arrivals of half the rate from its own seed.
  const std::size_t scheduled = poisson_arrivals(200, 0.5, 3).size() + poisson_arrivals(200, 0.5, 4).size();
  EXPECT_EQ(open.requests, scheduled);
  EXPECT_EQ(open.statuses[200], scheduled);
  EXPECT_EQ(service.answered(), before);  // GETs of /v2/health/live reach no model
}

TEST(Loadgen, LatencyIncludesTheServiceDelay) {
  DelayService service(15ms);
  RunningServer server(service);
  LoadResult result = run_load(LoadOptions(endpoint_of(server)).target("/v2/models/m/infer").body("{}").duration_seconds(0.2));
  ASSERT_GT(result.requests, 0u);
  EXPECT_GE(result.latency.p50_ms, 15);  // no request can be answered sooner
  EXPECT_LE(result.latency.p50_ms, result.latency.p90_ms);
  EXPECT_LE(result.latency.p90_ms, result.latency.p99_ms);
  EXPECT_LE(result.latency.p99_ms, result.latency.max_ms);
}

TEST(Loadgen, OpenLoopSendsEveryScheduledArrival) {
  DelayService service(0ms);
  RunningServer server(service);
  LoadOptions options = LoadOptions(endpoint_of(server)).concurrency(4).duration_seconds(0.5).rate(300).seed(9);
  LoadResult result = run_load(options);
  std::size_t scheduled = poisson_arrivals(300, 0.5, 9).size();
  EXPECT_EQ(result.requests, scheduled);
  EXPECT_EQ(result.statuses[200], scheduled);
  EXPECT_EQ(result.rate, 300);
}

TEST(Loadgen, PoissonArrivalsHaveTheRate) {
  std::vector<double> arrivals = poisson_arrivals(1000, 20, 4);
  EXPECT_TRUE(std::is_sorted(arrivals.begin(), arrivals.end()));
  EXPECT_LT(arrivals.back(), 20);
  // 20,000 expected; the count is Poisson, standard deviation ~141.
  EXPECT_NEAR(static_cast<double>(arrivals.size()), 20000, 700);
}

// One connection, a 10 ms service and arrivals every ~4 ms: requests queue behind each other.
// The k-th answer cannot come before (k + 1) * 10 ms, so its latency from its scheduled time
// is at least that minus its arrival time; a generator timing from the send would miss this.
TEST(Loadgen, OpenLoopLatencyCountsFromTheScheduledTime) {
  DelayService service(10ms);
  RunningServer server(service);
  LoadResult result = run_load(
      LoadOptions(endpoint_of(server)).target("/v2/models/m/infer").body("{}").duration_seconds(0.3).rate(250).seed(2));
  std::vector<double> arrivals = poisson_arrivals(250, 0.3, 2);
  double bound_ms = 0;
  for (std::size_t k = 0; k < arrivals.size(); ++k) bound_ms = std::max(bound_ms, (k + 1) * 10.0 - arrivals[k] * 1000);
  ASSERT_GT(bound_ms, 100);  // the schedule really overloads the service
  EXPECT_EQ(result.requests, arrivals.size());
  EXPECT_GE(result.latency.max_ms, bound_ms);
}

Endpoint grpc_endpoint(const GrpcServer& server) { return {"127.0.0.1", server.port(), Protocol::grpc}; }

TEST(Loadgen, GrpcClosedLoopCountsEveryAnswerByStatus) {
  DelayService service(1ms, /*reject_every=*/4);
  GrpcServer server(service, GrpcOptions().port(0));
  const std::string request = sample_grpc_request("m", service.model_metadata("m").body, 3);
  LoadResult result =
      run_load(LoadOptions(grpc_endpoint(server)).body(request).concurrency(3).threads(2).duration_seconds(0.3));
  ASSERT_GT(result.requests, 0u);
  EXPECT_EQ(result.requests, service.answered());
  EXPECT_EQ(result.statuses[503], service.rejected());  // UNAVAILABLE
  EXPECT_EQ(result.accepted, service.answered() - service.rejected());
  EXPECT_EQ(result.timeouts, 0u);
}

TEST(Loadgen, GrpcCallsTimeOut) {
  DelayService service(300ms);
  GrpcServer server(service, GrpcOptions().port(0));
  const std::string request = sample_grpc_request("m", service.model_metadata("m").body, 3);
  LoadResult result = run_load(
      LoadOptions(grpc_endpoint(server)).body(request).concurrency(2).duration_seconds(0.2).timeout(50ms));
  EXPECT_EQ(result.requests, 0u);
  EXPECT_GE(result.timeouts, 4u);
  EXPECT_LE(result.timeouts, 10u);
}

TEST(Loadgen, GrpcLoadIsClosedLoopAndTakesARequest) {
  DelayService service(0ms);
  GrpcServer server(service, GrpcOptions().port(0));
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(grpc_endpoint(server)).body("x").rate(10)); }),
            "--rate: the gRPC load runs closed loop only");
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(grpc_endpoint(server)).body("\x01")); }),
            "--input: not a serialized inference.ModelInferRequest");
}

TEST(Loadgen, RefusedConnectionsAreErrors) {
  int port;
  {
    DelayService service(0ms);
    RunningServer server(service);
    port = endpoint_of(server).port;
  }
  LoadResult result = run_load(LoadOptions(Endpoint{"127.0.0.1", port}).duration_seconds(0.05));
  EXPECT_EQ(result.requests, 0u);
  EXPECT_GT(result.connection_errors, 0u);
}

TEST(Loadgen, BadOptionsNameTheFlag) {
  Endpoint server;
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(server).concurrency(0)); }), "--concurrency: must be at least 1");
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(server).duration_seconds(0)); }), "--duration: must be positive");
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(server).rate(-1)); }), "--rate: must not be negative");
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(server).timeout(0ms)); }), "--timeout: must be positive");
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(server).threads(0)); }), "--threads: must be at least 1");
  EXPECT_EQ(error_message<UsageError>([&] { run_load(LoadOptions(server).concurrency(2).threads(3)); }),
            "--threads: must be at most --concurrency");
}

using afterburner::testing::CliProcess;

TEST(ServeAndLoadgenCommands, ServeAnswersLoadAndStopsOnSigterm) {
  TempDir dir;
  serve::testing::write_cnn_model(dir / "models", models::make_model("cnn"), serve::testing::cnn_config(8, "[8]", 1000));
  CliProcess serve({"serve", "--repo", (dir / "models").string(), "--port", "0", "--grpc-port", "0"},
                   dir / "serve.log");
  std::string log = serve.wait_for("on http://127.0.0.1:");
  std::size_t at = log.find("on http://127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << log;
  std::string url = log.substr(at + 3, log.find('\n', at) - at - 3);
  EXPECT_TRUE(Contains(http_get(parse_url(url), "/v2/health/live"), "true"));
  at = log.find("gRPC on ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string grpc_url = "grpc://" + log.substr(at + 8, log.find('\n', at) - at - 8);

  // JSON and binary over HTTP, and gRPC: every request answered 200.
  for (const auto& protocol : std::vector<std::vector<std::string>>{{url}, {url, "--binary"}, {grpc_url}}) {
    std::vector<std::string> args{"loadgen", "--model", "cnn", "--concurrency", "1,3", "--duration", "0.5", "--json",
                                  "--url"};
    args.insert(args.end(), protocol.begin(), protocol.end());
    auto run = afterburner::testing::run_cli(args);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    auto report = nlohmann::json::parse(run.out);
    ASSERT_EQ(report.size(), 2u);
    EXPECT_EQ(report[0]["concurrency"], 1);
    EXPECT_EQ(report[1]["concurrency"], 3);
    for (const auto& result : report) {
      EXPECT_GT(result["requests"].get<int>(), 0) << protocol.back();
      EXPECT_EQ(result["statuses"], nlohmann::json({{"200", result["requests"]}})) << protocol.back();
      EXPECT_EQ(result["accepted"], result["requests"]);
      EXPECT_EQ(result["timeouts"], 0);
      EXPECT_EQ(result["connection_errors"], 0);
    }
  }
  EXPECT_EQ(serve.stop(), 0);
  EXPECT_TRUE(Contains(afterburner::testing::read_file(dir / "serve.log"), "afterburner: stopped"));
}

// SIGTERM while the models load and warm up: the server starts, stops at once, and exits 0.
TEST(ServeAndLoadgenCommands, SigtermWhileLoadingStillExitsCleanly) {
  TempDir dir;
  serve::testing::write_cnn_model(dir / "models", models::make_model("cnn"), serve::testing::cnn_config());
  CliProcess serve({"serve", "--repo", (dir / "models").string(), "--port", "0"}, dir / "serve.log");
  serve.wait_for("afterburner: loading");
  EXPECT_EQ(serve.stop(), 0) << afterburner::testing::read_file(dir / "serve.log");
  EXPECT_TRUE(Contains(afterburner::testing::read_file(dir / "serve.log"), "afterburner: stopped"));
}

TEST(ServeAndLoadgenCommands, LoadgenBadInputNamesIt) {
  auto bad_url = afterburner::testing::run_cli({"loadgen", "--model", "cnn", "--url", "localhost:8000"});
  EXPECT_EQ(bad_url.exit_code, 2);
  EXPECT_TRUE(Contains(bad_url.err, "afterburner: --url: 'localhost:8000' does not start with http:// or grpc://"));
  auto binary_grpc = afterburner::testing::run_cli({"loadgen", "--model", "cnn", "--url", "grpc://127.0.0.1:1", "--binary"});
  EXPECT_EQ(binary_grpc.exit_code, 2);
  EXPECT_TRUE(Contains(binary_grpc.err, "afterburner: --binary: is for http:// servers"));
  auto no_file = afterburner::testing::run_cli({"loadgen", "--model", "cnn", "--input", "/nonexistent/body.json"});
  EXPECT_EQ(no_file.exit_code, 1);
  EXPECT_TRUE(Contains(no_file.err, "afterburner: /nonexistent/body.json: no such request body file"));
  auto bad_repo = afterburner::testing::run_cli({"serve", "--repo", "/nonexistent/models", "--port", "0"});
  EXPECT_EQ(bad_repo.exit_code, 1);
  EXPECT_TRUE(Contains(bad_repo.err, "/nonexistent/models"));
}

}  // namespace
}  // namespace afterburner::serve
