// NaN and infinities through a served model over HTTP: the zoo cnn, optimized at fp32 as the
// README's flow does (so it runs on oneDNN's layouts), answers images holding them as LibTorch's
// own ops do (the same file through torch::jit::load); a config that forbids them gets a 400
// naming the input and the element; JSON numbers beyond the datatype's range get a 400 naming
// the input and the number; an output holding NaN asked for as JSON gets a 500 naming it.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <string>

#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/models/zoo.h"
#include "afterburner/serve/model_service.h"
#include "afterburner/serve/protocol.h"
#include "cnn_repository.h"
#include "http_client.h"
#include "non_finite.h"
#include "running_server.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::TempDir;
using testing::HttpClient;
using testing::HttpReply;
using testing::RunningServer;

// The small cnn config with `allow_non_finite` added to its input when given.
std::string config_with(const std::string& allow_non_finite = "") {
  std::string config = testing::cnn_config(8, "[4, 8]");
  if (allow_non_finite.empty()) return config;
  const std::string dims = "dims = [1, 28, 28]\n";
  return config.insert(config.find(dims) + dims.size(), "allow_non_finite = " + allow_non_finite + "\n");
}

// REPOSITORY/cnn/model.pt: the zoo cnn exported, then optimized at fp32 as `afterburner
// optimize` writes it.
struct OptimizedCnn {
  TempDir repository;
  std::string file;

  explicit OptimizedCnn(const std::string& config) : file((repository / "cnn" / "model.pt").string()) {
    torch::manual_seed(0);
    testing::write_cnn_model(repository.path(), models::make_model("cnn"), config);
    infer::save_model(infer::optimize(infer::load_model(file)).model, file);
  }
};

// One NaN, one +inf and one -inf image, each at pixel [3, 4], and one finite.
torch::Tensor images_with_non_finite() {
  return afterburner::testing::images_with_non_finite({1, 28, 28}, 3 * 28 + 4);
}

HttpReply post_binary(HttpClient& client, const torch::Tensor& images) {
  const auto encoded =
      encode_infer_request({{"input", images}}, RequestOptions().binary_inputs(true).binary_outputs(true));
  return client.post("/v2/models/cnn/infer", encoded.body, encoded.json_length);
}

// A JSON request of one image whose first pixel is written `first_pixel` and the others `rest`.
HttpReply post_json_pixel(HttpClient& client, const std::string& first_pixel, bool binary_output = false,
                          const std::string& rest = "0") {
  std::string data = first_pixel;
  for (int i = 1; i < 28 * 28; ++i) data += "," + rest;
  const std::string parameters = binary_output ? R"("parameters":{"binary_data_output":true},)" : "";
  return client.post("/v2/models/cnn/infer",
                     fmt::format(R"({{{}"inputs":[{{"name":"input","datatype":"FP32","shape":[1,1,28,28],"data":[{}]}}]}})",
                                 parameters, data));
}

std::string error_of(const HttpReply& reply) { return nlohmann::json::parse(reply.body)["error"].get<std::string>(); }

TEST(ServedNonFinite, ImagesHoldingNanAndInfinitiesAnswerAsLibTorch) {
  OptimizedCnn cnn(config_with());
  ModelService service(cnn.repository.path().string());
  RunningServer running(service);
  HttpClient client(running.port());
  const torch::Tensor x = images_with_non_finite();
  const HttpReply reply = post_binary(client, x);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const torch::Tensor served = parse_infer_response(reply.body, reply.json_length()).at(0).second;
  torch::jit::Module libtorch = torch::jit::load(cnn.file);
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = libtorch.forward({x}).toTensor();
  EXPECT_TRUE(expected.slice(0, 0, 3).isnan().all().item<bool>()) << "each non-finite pixel reaches every logit";
  EXPECT_TRUE(afterburner::testing::AgreesWithNonFinite(served, expected, 1e-5, 1e-5));
}

TEST(ServedNonFinite, AConfigForbiddingThemRefusesTheRequestNamingTheInput) {
  OptimizedCnn cnn(config_with("false"));
  ModelService service(cnn.repository.path().string());
  RunningServer running(service);
  HttpClient client(running.port());
  const HttpReply refused = post_binary(client, images_with_non_finite());
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(error_of(refused),
            "input 'input': element [0, 0, 3, 4] is nan, and the model's config forbids NaN and infinities in it "
            "(allow_non_finite = false)");
  const HttpReply infinite = post_binary(client, images_with_non_finite().slice(0, 1));
  EXPECT_EQ(infinite.status, 400);
  EXPECT_TRUE(Contains(error_of(infinite), "input 'input': element [0, 0, 3, 4] is inf"));
  EXPECT_EQ(post_binary(client, images_with_non_finite().slice(0, 3)).status, 200) << "finite images pass";
  EXPECT_TRUE(Contains(service.metrics(), "afterburner_request_failure_total{model=\"cnn\"} 2\n"));
}

TEST(ServedNonFinite, JsonNumbersBeyondFp32Are400NamingTheInputAndNumber) {
  OptimizedCnn cnn(config_with());
  ModelService service(cnn.repository.path().string());
  RunningServer running(service);
  HttpClient client(running.port());
  for (const char* number : {"3.5e38", "1e39", "-1e39"}) {
    const HttpReply reply = post_json_pixel(client, number);
    EXPECT_EQ(reply.status, 400) << number;
    EXPECT_TRUE(Contains(error_of(reply), "input 'input'.data: ")) << reply.body;
    EXPECT_TRUE(Contains(error_of(reply), " is out of range for FP32 (largest 3.40282e+38)")) << reply.body;
  }
  EXPECT_TRUE(Contains(error_of(post_json_pixel(client, "1e39")), "1e+39 is out of range"));
  EXPECT_EQ(post_json_pixel(client, "3.4e38", /*binary_output=*/true).status, 200) << "the largest floats pass";
}

// JSON cannot carry a NaN output: the reply is an error naming the output and how to get it.
TEST(ServedNonFinite, NanOutputsAskedForAsJsonAre500NamingTheOutput) {
  OptimizedCnn cnn(config_with());
  ModelService service(cnn.repository.path().string());
  RunningServer running(service);
  HttpClient client(running.port());
  // Every pixel the largest float: sums overflow to infinities, and those of both signs to NaN.
  const HttpReply reply = post_json_pixel(client, "3.4e38", /*binary_output=*/false, "3.4e38");
  EXPECT_EQ(reply.status, 500);
  EXPECT_EQ(error_of(reply),
            "output 'output' of model 'cnn' holds NaN or infinite values, which JSON cannot carry; request it with "
            "\"binary_data\": true");
}

}  // namespace
}  // namespace afterburner::serve
