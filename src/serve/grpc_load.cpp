// The gRPC side of the load generator (serve/loadgen.h): model metadata and sample requests over
// gRPC, and one client thread's closed loop of ModelInfer calls.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "afterburner/core/error.h"
#include "afterburner/serve/loadgen.h"
#include "afterburner/serve/protocol.h"
#include "load_run.h"
#include "proto/inference.grpc.pb.h"

namespace afterburner::serve {
namespace {

namespace pb = ::inference;
using Clock = std::chrono::steady_clock;

std::string target_of(const Endpoint& server) { return server.host + ":" + std::to_string(server.port); }

// Each its own connection: gRPC would otherwise let channels of equal arguments share one, and
// the client threads would all wait on the same socket.
std::unique_ptr<pb::GRPCInferenceService::Stub> open_stub(const Endpoint& server) {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  arguments.SetMaxReceiveMessageSize(-1);
  arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  arguments.SetInt(GRPC_ARG_MINIMAL_STACK, 1);
  return pb::GRPCInferenceService::NewStub(
      grpc::CreateCustomChannel(target_of(server), grpc::InsecureChannelCredentials(), arguments));
}

nlohmann::json tensor_json(const pb::ModelMetadataResponse::TensorMetadata& tensor) {
  return {{"name", tensor.name()},
          {"datatype", tensor.datatype()},
          {"shape", std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end())}};
}

// What the answer of a call counts as: its HTTP status, as the server's HTTP side would answer
// (UNAVAILABLE is a full queue's 503); 0 for a time-out.
int counted_status(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::INVALID_ARGUMENT: return 400;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::UNIMPLEMENTED: return 501;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 0;
    default: return 500;
  }
}

// `concurrency` calls in flight on one connection, each followed by the next as it is answered,
// until the duration is over.
class GrpcRun {
 public:
  explicit GrpcRun(LoadOptions options) : options_(std::move(options)), stub_(open_stub(options_.server())) {
    if (options_.rate() > 0) throw UsageError("--rate", "the gRPC load runs closed loop only");
    if (!request_.ParseFromString(options_.body())) {
      throw UsageError("--input", "not a serialized inference.ModelInferRequest");
    }
  }

  load::RunSamples run() {
    start_ = last_answer_ = Clock::now();
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(options_.duration_seconds()));
    in_flight_ = options_.concurrency();
    for (int i = 0; i < options_.concurrency(); ++i) send();
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return in_flight_ == 0; });
    samples_.seconds = std::max(std::chrono::duration<double>(last_answer_ - start_).count(),
                                options_.duration_seconds());
    return std::move(samples_);
  }

 private:
  struct Call {
    grpc::ClientContext context;
    pb::ModelInferResponse response;
    Clock::time_point started = Clock::now();
  };

  void send() {
    auto call = std::make_shared<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + options_.timeout());  // gRPC takes system time
    stub_->async()->ModelInfer(&call->context, &request_, &call->response,
                               [this, call](grpc::Status status) mutable { answered(std::move(call), status); });
  }

  // On one of gRPC's threads. The call is released here, before `run` can return: its context
  // holds the channel, and a channel destroyed on gRPC's own callback thread would join that
  // very thread. The notification is sent under the lock, so `run` cannot return (and destroy
  // the condition variable) while it is being sent.
  void answered(std::shared_ptr<Call> call, const grpc::Status& status) {
    const Clock::time_point now = Clock::now();
    const Clock::time_point started = call->started;
    call.reset();
    std::unique_lock<std::mutex> lock(mutex_);
    const int code = counted_status(status);
    if (code == 0) {
      ++samples_.timeouts;
    } else {
      const double latency_ms = std::chrono::duration<double, std::milli>(now - started).count();
      samples_.latencies_ms.push_back(latency_ms);
      if (code == 200) samples_.accepted_ms.push_back(latency_ms);
      ++samples_.statuses[code];
      last_answer_ = now;
    }
    if (now < deadline_) {
      lock.unlock();
      return send();
    }
    if (--in_flight_ == 0) finished_.notify_all();
  }

  const LoadOptions options_;
  pb::ModelInferRequest request_;
  std::unique_ptr<pb::GRPCInferenceService::Stub> stub_;
  Clock::time_point start_, deadline_;

  std::mutex mutex_;
  std::condition_variable finished_;
  int in_flight_ = 0;
  Clock::time_point last_answer_;
  load::RunSamples samples_;
};

}  // namespace

std::string grpc_model_metadata(const Endpoint& server, const std::string& model) {
  pb::ModelMetadataRequest request;
  request.set_name(model);
  pb::ModelMetadataResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::Status status = open_stub(server)->ModelMetadata(&context, request, &response);
  if (!status.ok()) {
    throw Error(fmt::format("grpc://{}: ModelMetadata of '{}': {}", target_of(server), model, status.error_message()));
  }
  nlohmann::json inputs = nlohmann::json::array(), outputs = nlohmann::json::array();
  for (const auto& input : response.inputs()) inputs.push_back(tensor_json(input));
  for (const auto& output : response.outputs()) outputs.push_back(tensor_json(output));
  return nlohmann::json{{"name", response.name()}, {"inputs", inputs}, {"outputs", outputs}}.dump();
}

std::string sample_grpc_request(const std::string& model, const std::string& model_metadata, std::uint64_t seed) {
  pb::ModelInferRequest request;
  request.set_model_name(model);
  for (const auto& [name, tensor] : sample_inputs(model_metadata, seed)) {
    auto* input = request.add_inputs();
    input->set_name(name);
    input->set_datatype(std::string(datatype_name(datatype_of(tensor.scalar_type()))));
    for (const int64_t size : tensor.sizes()) input->add_shape(size);
    request.add_raw_input_contents(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  }
  return request.SerializeAsString();
}

namespace load {

RunSamples run_grpc(const LoadOptions& options) { return GrpcRun(options).run(); }

}  // namespace load
}  // namespace afterburner::serve
