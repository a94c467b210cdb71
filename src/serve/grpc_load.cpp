// The gRPC side of the load generator (serve/loadgen.h): model metadata and sample requests over
// gRPC, and one client thread's closed loop of ModelInfer calls.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>

#include "afterburner/core/error.h"
#include "afterburner/serve/loadgen.h"
#include "afterburner/serve/protocol.h"
#include "grpc_runtime.h"
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
  detail::use_release_mode_abseil();
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
// until the duration is over: on a completion queue this thread polls, which wakes no other
// thread (gRPC's callback API would run each answer on a thread of its own).
class GrpcRun {
 public:
  explicit GrpcRun(LoadOptions options) : options_(std::move(options)), stub_(open_stub(options_.server())) {
    if (options_.rate() > 0) throw UsageError("--rate", "the gRPC load runs closed loop only");
    if (!request_.ParseFromString(options_.body())) {
      throw UsageError("--input", "not a serialized inference.ModelInferRequest");
    }
  }

  ~GrpcRun() {
    queue_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (queue_.Next(&tag, &ok)) delete static_cast<Call*>(tag);
  }

  load::RunSamples run() {
    const Clock::time_point start = Clock::now();
    Clock::time_point last_answer = start;
    const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(options_.duration_seconds()));
    int in_flight = options_.concurrency();
    for (int i = 0; i < in_flight; ++i) send();
    load::RunSamples samples;
    void* tag = nullptr;
    bool ok = false;
    while (in_flight > 0 && queue_.Next(&tag, &ok)) {
      const std::unique_ptr<Call> call(static_cast<Call*>(tag));
      const Clock::time_point now = Clock::now();
      const int code = counted_status(call->status);
      if (code == 0) {
        ++samples.timeouts;
      } else {
        const double latency_ms = std::chrono::duration<double, std::milli>(now - call->started).count();
        samples.latencies_ms.push_back(latency_ms);
        if (code == 200) samples.accepted_ms.push_back(latency_ms);
        ++samples.statuses[code];
        last_answer = now;
      }
      if (now < deadline) {
        send();
      } else {
        --in_flight;
      }
    }
    samples.seconds =
        std::max(std::chrono::duration<double>(last_answer - start).count(), options_.duration_seconds());
    return samples;
  }

 private:
  struct Call {
    grpc::ClientContext context;
    pb::ModelInferResponse response;
    grpc::Status status;
    Clock::time_point started = Clock::now();
    std::unique_ptr<grpc::ClientAsyncResponseReader<pb::ModelInferResponse>> reader;
  };

  void send() {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + options_.timeout());  // gRPC takes system time
    call->reader = stub_->PrepareAsyncModelInfer(&call->context, request_, &queue_);
    call->reader->StartCall();
    Call* tag = call.release();  // the queue hands it back once answered
    tag->reader->Finish(&tag->response, &tag->status, tag);
  }

  const LoadOptions options_;
  pb::ModelInferRequest request_;
  std::unique_ptr<pb::GRPCInferenceService::Stub> stub_;
  grpc::CompletionQueue queue_;  // after the stub: drained and gone before the channel
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
