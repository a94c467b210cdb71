#include "afterburner/serve/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <future>

#include "afterburner/models/zoo.h"
#include "afterburner/serve/loadgen.h"
#include "afterburner/serve/model_service.h"
#include "afterburner/serve/protocol.h"
#include "cnn_repository.h"
#include "proto/inference.grpc.pb.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

namespace pb = ::inference;
using afterburner::testing::Contains;
using afterburner::testing::TempDir;

// A gRPC client of the v2 service, as Triton's and KServe's clients are.
class GrpcClient {
 public:
  explicit GrpcClient(int port)
      : stub_(pb::GRPCInferenceService::NewStub(
            grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()))) {}

  template <typename Request, typename Response, typename Call>
  grpc::Status call(Call method, const Request& request, Response& response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return ((*stub_).*method)(&context, request, &response);
  }

  grpc::Status infer(const pb::ModelInferRequest& request, pb::ModelInferResponse& response) {
    return call(&pb::GRPCInferenceService::Stub::ModelInfer, request, response);
  }

 private:
  std::unique_ptr<pb::GRPCInferenceService::Stub> stub_;
};

pb::ModelInferRequest raw_request(const at::Tensor& images, const std::string& model = "cnn") {
  pb::ModelInferRequest request;
  request.set_model_name(model);
  request.set_id("request-7");
  auto* input = request.add_inputs();
  input->set_name("input");
  input->set_datatype("FP32");
  for (const int64_t size : images.sizes()) input->add_shape(size);
  const at::Tensor data = images.contiguous();
  request.add_raw_input_contents(static_cast<const char*>(data.data_ptr()), data.nbytes());
  return request;
}

// The answer of the same images over HTTP's binary extension, as the output's bytes.
std::string http_binary_output(ModelService& service, const at::Tensor& images) {
  EncodedBody body = encode_infer_request({{"input", images}}, RequestOptions().binary_inputs(true).binary_outputs(true));
  std::promise<Reply> promise;
  service.infer("cnn", std::move(body.body), body.json_length, [&](Reply reply) { promise.set_value(std::move(reply)); });
  Reply reply = promise.get_future().get();
  EXPECT_EQ(reply.status, 200) << reply.body;
  const std::size_t json_length = std::stoul(reply.headers.at(0).second);
  return reply.body.substr(json_length);
}

class GrpcServerTest : public ::testing::Test {
 protected:
  GrpcServerTest() {
    testing::write_cnn_model(dir_.path(), models::make_model("cnn"), testing::cnn_config(64, "[16, 32, 64]", 2000));
    service_ = std::make_unique<ModelService>(dir_.path().string());
    server_ = std::make_unique<GrpcServer>(*service_, GrpcOptions().port(0));
    client_ = std::make_unique<GrpcClient>(server_->port());
  }

  TempDir dir_;
  std::unique_ptr<ModelService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<GrpcClient> client_;
};

TEST_F(GrpcServerTest, HealthAndMetadata) {
  pb::ServerLiveResponse live;
  ASSERT_TRUE(client_->call(&pb::GRPCInferenceService::Stub::ServerLive, pb::ServerLiveRequest(), live).ok());
  EXPECT_TRUE(live.live());
  pb::ServerReadyResponse ready;
  ASSERT_TRUE(client_->call(&pb::GRPCInferenceService::Stub::ServerReady, pb::ServerReadyRequest(), ready).ok());
  EXPECT_TRUE(ready.ready());
  pb::ServerMetadataResponse server;
  ASSERT_TRUE(client_->call(&pb::GRPCInferenceService::Stub::ServerMetadata, pb::ServerMetadataRequest(), server).ok());
  EXPECT_EQ(server.name(), "afterburner");
  ASSERT_EQ(server.extensions_size(), 1);
  EXPECT_EQ(server.extensions(0), "binary_tensor_data");

  pb::ModelReadyRequest which;
  which.set_name("cnn");
  pb::ModelReadyResponse model_ready;
  ASSERT_TRUE(client_->call(&pb::GRPCInferenceService::Stub::ModelReady, which, model_ready).ok());
  EXPECT_TRUE(model_ready.ready());

  pb::ModelMetadataRequest cnn;
  cnn.set_name("cnn");
  pb::ModelMetadataResponse metadata;
  ASSERT_TRUE(client_->call(&pb::GRPCInferenceService::Stub::ModelMetadata, cnn, metadata).ok());
  EXPECT_EQ(metadata.name(), "cnn");
  EXPECT_EQ(metadata.platform(), "pytorch_torchscript");
  ASSERT_EQ(metadata.versions_size(), 1);
  EXPECT_EQ(metadata.versions(0), "1");
  ASSERT_EQ(metadata.inputs_size(), 1);
  EXPECT_EQ(metadata.inputs(0).name(), "input");
  EXPECT_EQ(metadata.inputs(0).datatype(), "FP32");
  EXPECT_EQ(std::vector<int64_t>(metadata.inputs(0).shape().begin(), metadata.inputs(0).shape().end()),
            (std::vector<int64_t>{-1, 1, 28, 28}));
  ASSERT_EQ(metadata.outputs_size(), 1);
  EXPECT_EQ(metadata.outputs(0).name(), "output");

  pb::ModelMetadataRequest unknown;
  unknown.set_name("nope");
  grpc::Status missing = client_->call(&pb::GRPCInferenceService::Stub::ModelMetadata, unknown, metadata);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_message(), "unknown model 'nope'");
  cnn.set_version("2");
  grpc::Status version = client_->call(&pb::GRPCInferenceService::Stub::ModelMetadata, cnn, metadata);
  EXPECT_EQ(version.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(version.error_message(), "model 'cnn' has no version '2' (it serves version 1)");
}

// The acceptance test: the same batcher answers both protocols, byte for byte, at batch 1, an
// odd size and 64, and a second call gives the same bytes.
TEST_F(GrpcServerTest, ModelInferEqualsTheHttpAnswerBitForBit) {
  for (const int64_t batch : {1, 7, 64}) {
    const at::Tensor images = torch::randn({batch, 1, 28, 28}, torch::TensorOptions().dtype(torch::kFloat32));
    const std::string over_http = http_binary_output(*service_, images);
    for (int call = 0; call < 2; ++call) {
      pb::ModelInferResponse response;
      grpc::Status status = client_->infer(raw_request(images), response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(response.model_name(), "cnn");
      EXPECT_EQ(response.model_version(), "1");
      EXPECT_EQ(response.id(), "request-7");
      ASSERT_EQ(response.outputs_size(), 1);
      EXPECT_EQ(response.outputs(0).name(), "output");
      EXPECT_EQ(response.outputs(0).datatype(), "FP32");
      EXPECT_EQ(std::vector<int64_t>(response.outputs(0).shape().begin(), response.outputs(0).shape().end()),
                (std::vector<int64_t>{batch, 10}));
      ASSERT_EQ(response.raw_output_contents_size(), 1);
      EXPECT_EQ(response.raw_output_contents(0), over_http) << "batch " << batch << ", call " << call;
    }
  }
}

// The load generator's view of a gRPC server: its metadata as HTTP's JSON, and a sample request
// the model answers.
TEST_F(GrpcServerTest, LoadgenMetadataAndSampleRequest) {
  const Endpoint server{"127.0.0.1", server_->port(), Protocol::grpc};
  const auto metadata = nlohmann::json::parse(grpc_model_metadata(server, "cnn"));
  const auto over_http = nlohmann::json::parse(service_->model_metadata("cnn").body);
  EXPECT_EQ(metadata["inputs"], over_http["inputs"]);
  EXPECT_EQ(metadata["outputs"], over_http["outputs"]);
  pb::ModelInferRequest request;
  ASSERT_TRUE(request.ParseFromString(sample_grpc_request("cnn", metadata.dump(), 1)));
  pb::ModelInferResponse response;
  grpc::Status status = client_->infer(request, response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.raw_output_contents(0).size(), 10u * sizeof(float));
  EXPECT_TRUE(Contains(afterburner::testing::error_message<Error>([&] { grpc_model_metadata(server, "nope"); }),
                       "ModelMetadata of 'nope': unknown model 'nope'"));
}

TEST_F(GrpcServerTest, TypedContentsEqualRawBytes) {
  const at::Tensor images = torch::rand({3, 1, 28, 28});
  pb::ModelInferRequest typed = raw_request(images);
  typed.clear_raw_input_contents();
  const float* values = images.data_ptr<float>();
  for (int64_t i = 0; i < images.numel(); ++i) typed.mutable_inputs(0)->mutable_contents()->add_fp32_contents(values[i]);
  pb::ModelInferResponse from_typed, from_raw;
  ASSERT_TRUE(client_->infer(typed, from_typed).ok());
  ASSERT_TRUE(client_->infer(raw_request(images), from_raw).ok());
  EXPECT_EQ(from_typed.raw_output_contents(0), from_raw.raw_output_contents(0));
}

TEST_F(GrpcServerTest, BadRequestsNameTheProblem) {
  const at::Tensor images = torch::rand({2, 1, 28, 28});
  auto status_of = [&](const pb::ModelInferRequest& request) {
    pb::ModelInferResponse response;
    return client_->infer(request, response);
  };
  auto expect = [&](const pb::ModelInferRequest& request, grpc::StatusCode code, const std::string& message) {
    grpc::Status status = status_of(request);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_TRUE(Contains(status.error_message(), message)) << status.error_message();
  };
  expect(raw_request(images, "nope"), grpc::StatusCode::NOT_FOUND, "unknown model 'nope'");

  pb::ModelInferRequest short_bytes = raw_request(images);
  short_bytes.mutable_raw_input_contents(0)->resize(100);
  expect(short_bytes, grpc::StatusCode::INVALID_ARGUMENT,
         "input 'input': raw_input_contents size 100 does not match shape 2x1x28x28 of FP32 (6272 bytes)");

  expect(raw_request(torch::rand({2, 1, 27, 28})), grpc::StatusCode::INVALID_ARGUMENT,
         "input 'input': shape [2, 1, 27, 28] but the model takes [batch, 1, 28, 28]");

  pb::ModelInferRequest renamed = raw_request(images);
  renamed.mutable_inputs(0)->set_name("x");
  expect(renamed, grpc::StatusCode::INVALID_ARGUMENT, "inputs[0]: unknown input 'x' (the model takes 'input')");

  pb::ModelInferRequest unknown_output = raw_request(images);
  unknown_output.add_outputs()->set_name("logits");
  expect(unknown_output, grpc::StatusCode::INVALID_ARGUMENT, "outputs[0]: unknown output 'logits' (the model has 'output')");

  pb::ModelInferRequest both = raw_request(images);
  both.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
  expect(both, grpc::StatusCode::INVALID_ARGUMENT, "inputs[0]: both contents and raw_input_contents");

  pb::ModelInferRequest extra = raw_request(images);
  extra.add_raw_input_contents("1234");
  expect(extra, grpc::StatusCode::INVALID_ARGUMENT, "raw_input_contents holds 2 entries for 1 inputs");

  pb::ModelInferRequest half = raw_request(images);
  half.mutable_inputs(0)->set_datatype("FP16");
  half.clear_raw_input_contents();
  expect(half, grpc::StatusCode::INVALID_ARGUMENT, "inputs[0]: FP16 has no typed contents");

  pb::ModelInferRequest version = raw_request(images);
  version.set_model_version("3");
  expect(version, grpc::StatusCode::NOT_FOUND, "model 'cnn' has no version '3'");

  // The server is still serving.
  pb::ModelInferResponse response;
  EXPECT_TRUE(client_->infer(raw_request(images), response).ok());
}

// A service that answers every tensor request with the given HTTP status.
class StatusService : public Service {
 public:
  explicit StatusService(int status) : status_(status) {}
  bool live() const override { return true; }
  bool ready() const override { return true; }
  Reply server_metadata() const override { return {}; }
  Reply model_metadata(ModelRef) const override { return {}; }
  Reply model_ready(ModelRef) const override { return {}; }
  void infer(ModelRef, std::string, std::optional<std::size_t>, ReplyCallback reply) override { reply({}); }
  void infer_tensors(ModelRef, const TensorRequest&, TensorReplyCallback reply) override {
    TensorReply answer;
    answer.status = status_;
    answer.error = "status " + std::to_string(status_);
    reply(std::move(answer));
  }
  std::string metrics() const override { return ""; }

 private:
  int status_;
};

TEST(GrpcServer, ServiceStatusesBecomeTheProtocolsCodes) {
  const std::vector<std::pair<int, grpc::StatusCode>> codes{
      {400, grpc::StatusCode::INVALID_ARGUMENT}, {404, grpc::StatusCode::NOT_FOUND},
      {501, grpc::StatusCode::UNIMPLEMENTED},    {503, grpc::StatusCode::UNAVAILABLE},
      {504, grpc::StatusCode::DEADLINE_EXCEEDED}, {500, grpc::StatusCode::INTERNAL}};
  for (const auto& [http, code] : codes) {
    StatusService service(http);
    GrpcServer server(service, GrpcOptions().port(0));
    GrpcClient client(server.port());
    pb::ModelInferResponse response;
    grpc::Status status = client.infer(raw_request(torch::rand({1, 1, 28, 28})), response);
    EXPECT_EQ(status.error_code(), code) << http;
    EXPECT_EQ(status.error_message(), "status " + std::to_string(http));
  }
}

TEST(GrpcServer, MessagesOverTheLimitAreRefused) {
  StatusService service(200);
  GrpcServer server(service, GrpcOptions().port(0).max_message_bytes(1000));
  GrpcClient client(server.port());
  pb::ModelInferResponse response;
  grpc::Status status = client.infer(raw_request(torch::rand({1, 1, 28, 28})), response);  // 3,136 bytes of pixels
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
}

TEST(GrpcServer, APortInUseIsAnErrorNamingIt) {
  StatusService service(200);
  GrpcServer first(service, GrpcOptions().port(0));
  const std::string where = "127.0.0.1:" + std::to_string(first.port());
  EXPECT_EQ(afterburner::testing::error_message<Error>([&] { GrpcServer(service, GrpcOptions().port(first.port())); }),
            where + ": cannot listen for gRPC");
}

}  // namespace
}  // namespace afterburner::serve
