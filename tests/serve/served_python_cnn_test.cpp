// The acceptance scenario of issue 10, end to end: the cnn a user wrote in Python
// (Conv2d(1,32,3,padding=1)-ReLU-MaxPool2d(2)-Conv2d(32,64,3,padding=1)-ReLU-MaxPool2d(2)-Flatten-
// Linear(3136,128)-ReLU-Linear(128,10)), torch.jit.script'ed and saved by Python, in a model
// repository with the README's config.toml, served by the real `afterburner serve` executable
// on loopback. Every answer must be within 1e-5 absolute + 1e-5 relative of PyTorch's: at batch
// sizes 1, 2, 7 and 64, over JSON and binary tensors and gRPC, after 100 rounds of requests, and for
// single-sample requests from concurrent clients that the server batches dynamically.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstring>
#include <regex>
#include <thread>

#include "afterburner/serve/protocol.h"
#include "cnn_repository.h"
#include "http_client.h"
#include "infer/user_models.h"
#include "proto/inference.grpc.pb.h"
#include "server_process.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Batch;
using afterburner::testing::UserModel;

// The single output of a reply named as the README's config names it.
at::Tensor only_output(const std::vector<NamedTensor>& outputs) {
  if (outputs.size() != 1 || outputs[0].first != "output") throw std::runtime_error("unexpected outputs");
  return outputs[0].second;
}

uint64_t metric(const std::string& metrics, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(metrics, match, std::regex(name + R"(\{model="cnn"\} ([0-9]+))"))) {
    throw std::runtime_error(name + " missing from /metrics");
  }
  return std::stoull(match[1]);
}

TEST(ServedPythonCnn, EveryAnswerIsPyTorchsAtEveryBatchSizeAfterAnyNumberOfRequests) {
  const UserModel& cnn = afterburner::testing::user_model("cnn_scripted");
  afterburner::testing::TempDir repository;
  std::filesystem::create_directories(repository / "cnn");
  std::filesystem::copy_file(cnn.file, repository / "cnn" / "model.pt");
  afterburner::testing::write_file(repository / "cnn" / "config.toml", testing::cnn_config());  // the README's
  testing::ServerProcess server({"serve", "--repo", repository.path().string(), "--port", "0", "--grpc-port", "0"});

  // Batch sizes 1, 2, 7, 64, then 100 rounds of 1, 2 and 7, on one keep-alive connection.
  testing::HttpClient client(server.port());
  for (bool binary : {false, true}) {
    auto runner = [&](const std::vector<at::Tensor>& inputs) {
      return std::vector<at::Tensor>{only_output(testing::infer(client, "cnn", {{"input", inputs.at(0)}}, binary))};
    };
    auto check = afterburner::testing::check_path(
        cnn, binary ? "afterburner serve (README config), binary" : "afterburner serve (README config)", runner,
        afterburner::testing::kExact);
    EXPECT_TRUE(check.passed) << (binary ? "binary: " : "JSON: ") << check.failure;
  }

  // The same over gRPC's ModelInfer (raw contents), as Triton's and KServe's clients send it.
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(server.grpc_port()), grpc::InsecureChannelCredentials()));
  auto over_grpc = [&](const std::vector<at::Tensor>& inputs) {
    const at::Tensor images = inputs.at(0).contiguous();
    inference::ModelInferRequest request;
    request.set_model_name("cnn");
    auto* input = request.add_inputs();
    input->set_name("input");
    input->set_datatype("FP32");
    for (const int64_t size : images.sizes()) input->add_shape(size);
    request.add_raw_input_contents(static_cast<const char*>(images.data_ptr()), images.nbytes());
    inference::ModelInferResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->ModelInfer(&context, request, &response);
    if (!status.ok()) throw std::runtime_error("ModelInfer: " + status.error_message());
    const std::string& bytes = response.raw_output_contents(0);
    at::Tensor output = at::empty({images.size(0), 10});
    if (bytes.size() != output.nbytes()) throw std::runtime_error("ModelInfer: output of the wrong size");
    std::memcpy(output.data_ptr(), bytes.data(), bytes.size());
    return std::vector<at::Tensor>{output};
  };
  auto grpc_check = afterburner::testing::check_path(cnn, "afterburner serve (README config), gRPC", over_grpc,
                                                     afterburner::testing::kExact);
  EXPECT_TRUE(grpc_check.passed) << "gRPC: " << grpc_check.failure;

  // Single samples from 8 clients at once, 128 requests: the server batches them as it likes,
  // each answer is still its sample's row of Python's batch of 64.
  const auto before = client.get("/metrics").body;
  const Batch& python = cnn.batches.at(64);
  constexpr int kClients = 8, kRequestsPerClient = 16;
  std::atomic<int> correct{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      testing::HttpClient own(server.port());
      for (int i = 0; i < kRequestsPerClient; ++i) {
        const int64_t row = (c * kRequestsPerClient + i) % 64;
        try {
          auto output = only_output(testing::infer(own, "cnn", {{"input", python.inputs[0].slice(0, row, row + 1)}}, i % 2));
          correct += torch::allclose(output, python.outputs[0].slice(0, row, row + 1), 1e-5, 1e-5);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "client " << c << " request " << i << ": " << e.what();
        }
      }
    });
  }
  for (auto& thread : clients) thread.join();
  EXPECT_EQ(correct, kClients * kRequestsPerClient);
  const auto after = client.get("/metrics").body;
  const auto samples = metric(after, "afterburner_inference_count_total") - metric(before, "afterburner_inference_count_total");
  const auto batches = metric(after, "afterburner_execution_count_total") - metric(before, "afterburner_execution_count_total");
  EXPECT_EQ(samples, static_cast<uint64_t>(kClients * kRequestsPerClient));
  EXPECT_LT(batches, samples) << "the single-sample requests were never batched together";
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
}  // namespace afterburner::serve
