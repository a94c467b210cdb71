#include "afterburner/serve/model_service.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "afterburner/core/error.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/models/zoo.h"
#include "afterburner/serve/protocol.h"
#include "cnn_repository.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::error_message;
using afterburner::testing::TempDir;
using afterburner::testing::write_file;

// The issue's config with smaller batches, so that warm-up stays short.
std::string small_cnn_config(int64_t output_dims = 10) { return testing::cnn_config(8, "[4, 8]", 2000, output_dims); }

// A repository with the zoo's cnn exported to TorchScript; the Sequential is the reference.
struct CnnRepository {
  TempDir dir;
  torch::nn::Sequential model = models::make_model("cnn");

  explicit CnnRepository(const std::string& config = small_cnn_config()) {
    testing::write_cnn_model(dir.path(), model, config);
  }

  at::Tensor reference(const at::Tensor& x) {
    torch::NoGradGuard no_grad;
    return model->forward(x);
  }
};

Reply infer(ModelService& service, std::string_view model, std::string body,
            std::optional<std::size_t> json_length = std::nullopt) {
  std::promise<Reply> promise;
  auto future = promise.get_future();
  service.infer(model, std::move(body), json_length, [&promise](Reply reply) { promise.set_value(std::move(reply)); });
  if (future.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "no reply";
    return {};
  }
  return future.get();
}

at::Tensor only_output(const Reply& reply) {
  std::optional<std::size_t> json_length;
  if (!reply.headers.empty()) json_length = std::stoul(reply.headers.at(0).second);
  auto outputs = parse_infer_response(reply.body, json_length);
  EXPECT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs.at(0).first, "output");
  return outputs.at(0).second;
}

TEST(ModelService, JsonInferenceEqualsTheModelsOwnForward) {
  CnnRepository repository;
  ModelService service(repository.dir.path().string());
  EXPECT_TRUE(service.ready());
  for (int64_t samples : {1, 3}) {
    at::Tensor x = torch::randn({samples, 1, 28, 28});
    Reply reply = infer(service, "cnn", encode_infer_request({{"input", x}}, RequestOptions().id("q1")).body);
    ASSERT_EQ(reply.status, 200) << reply.body;
    EXPECT_EQ(reply.content_type, "application/json");
    EXPECT_EQ(nlohmann::json::parse(reply.body)["id"], "q1");
    EXPECT_TRUE(torch::allclose(only_output(reply), repository.reference(x), 1e-5, 1e-5));
  }
}

TEST(ModelService, BinaryInputsAndOutputs) {
  CnnRepository repository;
  ModelService service(repository.dir.path().string());
  at::Tensor x = torch::randn({2, 1, 28, 28});
  auto encoded = encode_infer_request({{"input", x}}, RequestOptions().binary_inputs(true).binary_outputs(true));
  Reply reply = infer(service, "cnn", encoded.body, encoded.json_length);
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.content_type, "application/octet-stream");
  EXPECT_TRUE(torch::allclose(only_output(reply), repository.reference(x), 1e-5, 1e-5));
}

TEST(ModelService, ConcurrentRequestsAreAllAnsweredAndCounted) {
  CnnRepository repository;
  ModelService service(repository.dir.path().string());
  constexpr int kThreads = 4;
  constexpr int kRequests = 16;
  std::vector<std::thread> threads;
  std::atomic<int> correct{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRequests; ++i) {
        at::Tensor x = torch::randn({1, 1, 28, 28});
        Reply reply = infer(service, "cnn", encode_infer_request({{"input", x}}).body);
        correct += reply.status == 200 && torch::allclose(only_output(reply), repository.reference(x), 1e-5, 1e-5);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(correct, kThreads * kRequests);
  std::string metrics = service.metrics();
  EXPECT_TRUE(Contains(metrics, "afterburner_request_success_total{model=\"cnn\"} 64\n"));
  EXPECT_TRUE(Contains(metrics, "afterburner_inference_count_total{model=\"cnn\"} 64\n"));
  EXPECT_TRUE(Contains(metrics, "afterburner_pending_requests{model=\"cnn\"} 0\n"));
  // Each answered request's latency, and each batch's size (which add up to the samples).
  EXPECT_TRUE(Contains(metrics, "afterburner_request_duration_seconds_count{model=\"cnn\"} 64\n"));
  EXPECT_TRUE(Contains(metrics, "afterburner_batch_size_sum{model=\"cnn\"} 64\n"));
  EXPECT_TRUE(Contains(metrics, "afterburner_request_rejected_total{model=\"cnn\"} 0\n"));
}

TEST(ModelService, BadRequestsAnswerWithAnErrorAndCountAsFailures) {
  CnnRepository repository;
  ModelService service(repository.dir.path().string());
  Reply unknown = infer(service, "resnet", "{}");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(nlohmann::json::parse(unknown.body)["error"], "unknown model 'resnet'");
  Reply malformed = infer(service, "cnn", "{\"inputs\": [");
  EXPECT_EQ(malformed.status, 400);
  EXPECT_TRUE(Contains(nlohmann::json::parse(malformed.body)["error"], "request body"));
  Reply too_many = infer(service, "cnn", encode_infer_request({{"input", torch::zeros({9, 1, 28, 28})}}).body);
  EXPECT_EQ(too_many.status, 400);
  EXPECT_TRUE(Contains(nlohmann::json::parse(too_many.body)["error"], "max_batch_size"));
  EXPECT_TRUE(Contains(service.metrics(), "afterburner_request_failure_total{model=\"cnn\"} 2\n"));
}

// Shedding load costs no parsing: with the queue full, even a body that is no JSON (or a tensor
// request) gets the 503, and the queued request is still answered.
TEST(ModelService, AFullQueueRefusesBeforeParsing) {
  // One request fills the queue; a batch waits for 8 samples or an hour.
  CnnRepository repository("max_queue_size = 1\n" + testing::cnn_config(8, "[8]", 3'600'000'000));
  std::promise<Reply> queued;
  {
    ModelService service(repository.dir.path().string());
    service.infer("cnn", encode_infer_request({{"input", torch::rand({1, 1, 28, 28})}}).body, std::nullopt,
                  [&](Reply reply) { queued.set_value(std::move(reply)); });
    Reply refused = infer(service, "cnn", "not JSON");
    EXPECT_EQ(refused.status, 503);
    EXPECT_EQ(nlohmann::json::parse(refused.body)["error"], "model 'cnn': queue full (1 requests)");
    TensorReply tensor_refused;
    service.infer_tensors("cnn", TensorRequest{}, [&](TensorReply reply) { tensor_refused = std::move(reply); });
    EXPECT_EQ(tensor_refused.status, 503);
    EXPECT_EQ(tensor_refused.error, "model 'cnn': queue full (1 requests)");
    EXPECT_TRUE(Contains(service.metrics(), "afterburner_request_rejected_total{model=\"cnn\"} 2\n"));
    EXPECT_TRUE(Contains(service.metrics(), "afterburner_request_failure_total{model=\"cnn\"} 2\n"));
  }  // shutting down runs the queued request
  EXPECT_EQ(queued.get_future().get().status, 200);
}

TEST(ModelService, MetadataFollowsTheProtocol) {
  CnnRepository repository;
  ModelService service(repository.dir.path().string());
  auto server = nlohmann::json::parse(service.server_metadata().body);
  EXPECT_EQ(server["name"], "afterburner");
  EXPECT_EQ(server["extensions"], nlohmann::json({"binary_tensor_data"}));
  Reply reply = service.model_metadata("cnn");
  EXPECT_EQ(reply.status, 200);
  auto model = nlohmann::json::parse(reply.body);
  EXPECT_EQ(model["name"], "cnn");
  EXPECT_EQ(model["platform"], "pytorch_torchscript");
  EXPECT_EQ(model["inputs"], nlohmann::json::parse(R"([{"name":"input","datatype":"FP32","shape":[-1,1,28,28]}])"));
  EXPECT_EQ(model["outputs"], nlohmann::json::parse(R"([{"name":"output","datatype":"FP32","shape":[-1,10]}])"));
  EXPECT_EQ(service.model_metadata("mlp").status, 404);
  EXPECT_EQ(service.model_ready("cnn").status, 200);
  EXPECT_EQ(service.model_ready("mlp").status, 404);
  EXPECT_TRUE(service.live());
}

TEST(ModelService, ReadyOnlyOnceWarmedUp) {
  CnnRepository repository;
  ModelService service(repository.dir.path().string(), ModelServiceOptions().wait_for_warm_up(false));
  service.wait_until_ready();
  EXPECT_TRUE(service.ready());
  EXPECT_EQ(service.model_ready("cnn").status, 200);
  EXPECT_TRUE(Contains(service.metrics(), "afterburner_execution_count_total{model=\"cnn\"} 0\n"));
}

TEST(ModelService, WithoutDynamicBatchingEveryRequestIsAnExecution) {
  CnnRepository repository;
  ModelService service(repository.dir.path().string(), ModelServiceOptions().dynamic_batching(false));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(infer(service, "cnn", encode_infer_request({{"input", torch::randn({1, 1, 28, 28})}}).body).status,
                  200);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(Contains(service.metrics(), "afterburner_execution_count_total{model=\"cnn\"} 20\n"));
}

TEST(ModelService, ACorruptModelFileIsNamedAtStartUp) {
  CnnRepository repository;
  std::string model_file = (repository.dir / "cnn" / "model.pt").string();
  write_file(model_file, "this is not a TorchScript archive");
  std::string message = error_message<Error>([&] { ModelService service(repository.dir.path().string()); });
  EXPECT_TRUE(Contains(message, model_file + ": not a loadable TorchScript model"));
}

TEST(ModelService, OutputsThatDoNotMatchTheConfigAreNamedAtStartUp) {
  CnnRepository repository(small_cnn_config(12));
  std::string message = error_message<Error>([&] { ModelService service(repository.dir.path().string()); });
  EXPECT_TRUE(Contains(message, (repository.dir / "cnn" / "model.pt").string() + ": output 'output'"));
  EXPECT_TRUE(Contains(message, "declares FP32 [batch, 12]"));
}

// A repository whose cnn is a 3x3 convolution (1 -> 4 channels, no bias) called as `convolution`
// (TorchScript source), with the cnn's config (it fails before returning anything) and a
// training attribute as Python saves one.
void write_convolution_model(const std::filesystem::path& repository, const std::string& convolution) {
  torch::jit::Module model("__torch__.Convolution");
  model.register_attribute("training", c10::BoolType::get(), false);
  model.register_parameter("weight", torch::randn({4, 1, 3, 3}), false);
  model.define("def forward(self, x):\n    return " + convolution + "\n");
  std::filesystem::create_directories(repository / "cnn");
  model.save((repository / "cnn" / "model.pt").string());
  write_file(repository / "cnn" / "config.toml", small_cnn_config());
}

// LibTorch's oneDNN layout divided by this stride of 0 and ended the server (SIGFPE): the
// start-up error names the file and the convolution, in one line.
TEST(ModelService, AConvolutionOneDnnCannotLayOutIsNamedAtStartUp) {
  TempDir dir;
  write_convolution_model(dir.path(), "torch.conv2d(x, self.weight, None, [1, 0])");
  std::string message = error_message<Error>([&] { ModelService service(dir.path().string()); });
  EXPECT_TRUE(Contains(message, (dir / "cnn" / "model.pt").string() + ": cannot be prepared for serving (infer: "
                                "aten::conv2d with stride [1, 0] is not supported: stride must be at least 1)"));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// small_cnn_config with its input's `key = value` line (the first of that key) replaced.
std::string small_cnn_config_with(const std::string& line, const std::string& replacement) {
  std::string config = small_cnn_config();
  return config.replace(config.find(line), line.size(), replacement);
}

// One line that names the model, opens with LibTorch's reason and closes with the inputs it was
// given, without the TorchScript traceback (some 3,000 characters) it used to quote.
TEST(ModelService, AWarmUpFailureIsOneShortLineWithTheCauseFirst) {
  CnnRepository repository(small_cnn_config_with("dims = [1, 28, 28]", "dims = [2, 28, 28]"));
  std::string message = error_message<Error>([&] { ModelService service(repository.dir.path().string()); });
  EXPECT_EQ(message.rfind("model 'cnn': warm-up failed: Given groups=1, weight of size [32, 1, 3, 3], expected "
                          "input[1, 2, 28, 28] to have 1 channels, but got 2 channels instead",
                          0),
            0u)
      << message;
  EXPECT_TRUE(Contains(message, "(on zeros shaped as the config's inputs: 'input' FP32 [1, 2, 28, 28])"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_FALSE(Contains(message, "\\x0a"));
  EXPECT_FALSE(Contains(message, "Traceback"));
  EXPECT_LT(message.size(), 300u);
}

// FP16 images for an FP32 model, optimized as served (oneDNN's layouts, whose error is
// "dense_to_mkldnn expects float or bfloat16 tensor input"): the input, the configured datatype
// and the model's are named first.
TEST(ModelService, AConfigDatatypeTheModelCannotTakeIsNamed) {
  CnnRepository repository(small_cnn_config_with("datatype = \"FP32\"", "datatype = \"FP16\""));
  const std::string file = (repository.dir / "cnn" / "model.pt").string();
  infer::save_model(infer::optimize(infer::load_model(file)).model, file);
  std::string message = error_message<Error>([&] { ModelService service(repository.dir.path().string()); });
  EXPECT_EQ(message.rfind("model 'cnn': warm-up failed: input 'input' is FP16 in " +
                              (repository.dir / "cnn" / "config.toml").string() + ", but the model computes in FP32: ",
                          0),
            0u)
      << message;
  EXPECT_TRUE(Contains(message, "(on zeros shaped as the config's inputs: 'input' FP16 [1, 1, 28, 28])"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace afterburner::serve
