// Model control: versions in the repository, load and unload requests, polling the repository,
// and a model replaced while requests keep coming.
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "afterburner/serve/model_service.h"
#include "afterburner/serve/protocol.h"
#include "cnn_repository.h"
#include "http_client.h"
#include "infer/user_models.h"
#include "running_server.h"
#include "server_process.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

namespace fs = std::filesystem;
using afterburner::testing::Contains;
using afterburner::testing::error_message;
using afterburner::testing::TempDir;
using afterburner::testing::write_file;
using namespace std::chrono_literals;

std::string small_config() { return testing::cnn_config(8, "[4, 8]", 2000); }

// A cnn of its own random weights, exported as REPOSITORY/<name>/<version>/model.pt (written
// beside and renamed into place, as a deployment should: a poll never sees half a file).
struct CnnVersion {
  torch::nn::Sequential model = models::make_model("cnn");

  CnnVersion(const fs::path& repository, const std::string& name, const std::string& version) {
    fs::create_directories(repository / name / version);
    write_file(repository / name / "config.toml", small_config());
    model->eval();
    const fs::path staged = repository / (name + "-" + version + ".pt");
    models::export_torchscript(model, staged.string());
    fs::rename(staged, repository / name / version / "model.pt");
  }

  at::Tensor reference(const at::Tensor& x) {
    torch::NoGradGuard no_grad;
    return model->forward(x);
  }
};

Reply await(const std::function<void(ReplyCallback)>& call) {
  std::promise<Reply> promise;
  auto future = promise.get_future();
  call([&promise](Reply reply) { promise.set_value(std::move(reply)); });
  if (future.wait_for(120s) != std::future_status::ready) {
    ADD_FAILURE() << "no reply";
    return {};
  }
  return future.get();
}

Reply infer(ModelService& service, ModelRef model, const at::Tensor& x) {
  return await([&](ReplyCallback reply) { service.infer(model, encode_infer_request({{"input", x}}).body, {}, reply); });
}

at::Tensor output_of(const Reply& reply) { return parse_infer_response(reply.body, std::nullopt).at(0).second; }

std::string error_of(const Reply& reply) { return nlohmann::json::parse(reply.body).value("error", ""); }

nlohmann::json index_of(const ModelService& service, std::string_view body = "") {
  const Reply reply = service.repository_index(body);
  EXPECT_EQ(reply.status, 200) << reply.body;
  return nlohmann::json::parse(reply.body);
}

// Polls `condition` every 50 ms for up to a minute.
bool eventually(const std::function<bool()>& condition) {
  for (int attempt = 0; attempt < 1200; ++attempt) {
    if (condition()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

TEST(ModelControl, ExplicitLoadsTheNamedModelsThenWhatRequestsSay) {
  TempDir repository;
  CnnVersion a(repository.path(), "a", "1");
  CnnVersion b(repository.path(), "b", "1");
  ModelService service(repository.path().string(),
                       ModelServiceOptions().model_control(ModelControl::explicit_).load_models({"a"}));
  EXPECT_EQ(index_of(service), nlohmann::json::parse(R"([{"name":"a","version":"1","state":"READY"},
                                                         {"name":"b","state":"UNAVAILABLE","reason":"not loaded"}])"));
  EXPECT_EQ(index_of(service, R"({"ready": true})").size(), 1u);
  const at::Tensor x = torch::randn({3, 1, 28, 28});
  EXPECT_EQ(error_of(infer(service, "b", x)), "model 'b' is not loaded");

  const Reply loaded = await([&](ReplyCallback reply) { service.load_model("b", reply); });
  ASSERT_EQ(loaded.status, 200) << loaded.body;
  EXPECT_EQ(nlohmann::json::parse(loaded.body), nlohmann::json::parse(R"({"name":"b","version":"1","state":"READY"})"));
  for (int call = 0; call < 2; ++call) {
    EXPECT_TRUE(torch::allclose(output_of(infer(service, "b", x)), b.reference(x), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(output_of(infer(service, "a", x)), a.reference(x), 1e-5, 1e-5));
  }

  ASSERT_EQ(await([&](ReplyCallback reply) { service.unload_model("a", reply); }).status, 200);
  const Reply gone = infer(service, "a", x);
  EXPECT_EQ(gone.status, 404);
  EXPECT_EQ(error_of(gone), "model 'a' is not loaded (unloaded)");
  EXPECT_EQ(service.model_metadata("a").status, 404);
  EXPECT_FALSE(Contains(service.metrics(), "model=\"a\""));
  EXPECT_TRUE(Contains(service.metrics(), "afterburner_request_success_total{model=\"b\"} 2\n"));
  EXPECT_EQ(index_of(service)[0], nlohmann::json::parse(R"({"name":"a","state":"UNAVAILABLE","reason":"unloaded"})"));

  const Reply again = await([&](ReplyCallback reply) { service.unload_model("a", reply); });
  EXPECT_EQ(again.status, 400);
  EXPECT_EQ(error_of(again), "model 'a' is not loaded");
  const Reply missing = await([&](ReplyCallback reply) { service.load_model("nope", reply); });
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(error_of(missing), "model 'nope' not loaded: " + (repository.path() / "nope").string() +
                                   ": no such model directory");
  EXPECT_EQ(index_of(service).size(), 2u);  // no entry for it
  const Reply escape = await([&](ReplyCallback reply) { service.load_model("..", reply); });
  EXPECT_EQ(escape.status, 400);
  EXPECT_EQ(error_of(escape), "'..' is no model name");
  // A failed load leaves the model served as it was.
  EXPECT_TRUE(torch::allclose(output_of(infer(service, "b", x)), b.reference(x), 1e-5, 1e-5));
}

TEST(ModelControl, WithoutExplicitControlLoadAndUnloadAreRefused) {
  TempDir repository;
  CnnVersion cnn(repository.path(), "cnn", "4");
  ModelService service(repository.path().string());
  EXPECT_EQ(index_of(service), nlohmann::json::parse(R"([{"name":"cnn","version":"4","state":"READY"}])"));
  EXPECT_EQ(nlohmann::json::parse(service.model_metadata("cnn").body)["versions"], nlohmann::json({"4"}));
  const Reply load = await([&](ReplyCallback reply) { service.load_model("cnn", reply); });
  EXPECT_EQ(load.status, 400);
  EXPECT_EQ(error_of(load), "model 'cnn': load requests need serve --model-control explicit");
  EXPECT_EQ(await([&](ReplyCallback reply) { service.unload_model("cnn", reply); }).status, 400);
  const Reply bad_index = service.repository_index("[1]");
  EXPECT_EQ(bad_index.status, 400);
  EXPECT_EQ(error_of(bad_index), "repository index: the body is not a JSON object");
  EXPECT_EQ(error_of(service.repository_index(R"({"ready": 1})")), "repository index: 'ready' is not true or false");
  EXPECT_EQ(error_message<UsageError>([&] { ModelService(repository.path().string(), ModelServiceOptions().load_models({"cnn"})); }),
            "--load-model: takes effect with --model-control explicit only");
}

// The acceptance's swap: clients keep sending while version 2 is loaded over HTTP. No request
// fails; each is answered by version 1 or version 2 whole; once the load is answered, only by 2.
TEST(ModelControl, AModelReplacedWhileServingLosesNoRequest) {
  TempDir repository;
  CnnVersion first(repository.path(), "cnn", "1");
  ModelService service(repository.path().string(), ModelServiceOptions().model_control(ModelControl::explicit_).load_models({"cnn"}));
  testing::RunningServer running(service);
  const at::Tensor x = torch::randn({1, 1, 28, 28});
  const at::Tensor from_first = first.reference(x);

  struct Answer {
    int status;
    at::Tensor output;
    bool after_swap;
  };
  std::mutex answers_mutex;
  std::vector<Answer> answers;
  std::atomic<bool> swapped{false}, stop{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c) {
    clients.emplace_back([&] {
      testing::HttpClient client(running.port());
      const std::string body = encode_infer_request({{"input", x}}).body;
      while (!stop) {
        const bool after_swap = swapped;  // read before sending: the answer must come from 2
        const testing::HttpReply reply = client.post("/v2/models/cnn/infer", body);
        Answer answer{reply.status, {}, after_swap};
        if (reply.status == 200) answer.output = parse_infer_response(reply.body, std::nullopt).at(0).second;
        std::lock_guard<std::mutex> lock(answers_mutex);
        answers.push_back(std::move(answer));
      }
    });
  }
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(answers_mutex);
    return answers.size() >= 30;
  }));
  CnnVersion second(repository.path(), "cnn", "2");
  const at::Tensor from_second = second.reference(x);
  testing::HttpClient control(running.port());
  const testing::HttpReply loaded = control.post("/v2/repository/models/cnn/load", "");
  swapped = true;
  EXPECT_EQ(loaded.status, 200) << loaded.body;
  std::size_t swapped_at = 0;
  {
    std::lock_guard<std::mutex> lock(answers_mutex);
    swapped_at = answers.size();
  }
  ASSERT_TRUE(eventually([&] {
    std::lock_guard<std::mutex> lock(answers_mutex);
    return answers.size() >= swapped_at + 30;
  }));
  stop = true;
  for (auto& client : clients) client.join();

  int by_first = 0, by_second = 0;
  for (const Answer& answer : answers) {
    ASSERT_EQ(answer.status, 200);
    const bool first_answered = torch::allclose(answer.output, from_first, 1e-5, 1e-5);
    const bool second_answered = torch::allclose(answer.output, from_second, 1e-5, 1e-5);
    EXPECT_TRUE(first_answered != second_answered) << answer.output;
    by_first += first_answered;
    by_second += second_answered;
    if (answer.after_swap) {
      EXPECT_TRUE(second_answered);
    }
  }
  EXPECT_GE(by_first, 30);
  EXPECT_GE(by_second, 30);
  EXPECT_TRUE(Contains(service.metrics(), fmt::format("afterburner_request_success_total{{model=\"cnn\"}} {}\n", answers.size())));

  EXPECT_EQ(nlohmann::json::parse(control.get("/v2/models/cnn").body)["versions"], nlohmann::json({"2"}));
  EXPECT_EQ(control.get("/v2/models/cnn/versions/2/ready").status, 200);
  const testing::HttpReply old = control.get("/v2/models/cnn/versions/1/ready");
  EXPECT_EQ(old.status, 404);
  EXPECT_EQ(nlohmann::json::parse(old.body)["error"], "model 'cnn' has no version '1' (it serves version 2)");
}

// Poll: a new version directory is served, a broken one is refused while the last good one
// stays, a model directory added is loaded and one removed unloaded.
TEST(ModelControl, PollFollowsTheRepository) {
  TempDir repository;
  CnnVersion first(repository.path(), "cnn", "1");
  std::mutex log_mutex;
  std::vector<std::string> log;
  ModelService service(repository.path().string(), ModelServiceOptions()
                                                       .model_control(ModelControl::poll)
                                                       .poll_interval(100ms)
                                                       .log([&](const std::string& line) {
                                                         std::lock_guard<std::mutex> lock(log_mutex);
                                                         log.push_back(line);
                                                       }));
  const at::Tensor x = torch::randn({2, 1, 28, 28});
  auto version_served = [&] {
    const Reply metadata = service.model_metadata("cnn");
    return metadata.status == 200 ? nlohmann::json::parse(metadata.body)["versions"][0].get<std::string>() : "";
  };
  EXPECT_EQ(version_served(), "1");

  CnnVersion second(repository.path(), "cnn", "2");
  ASSERT_TRUE(eventually([&] { return version_served() == "2"; }));
  EXPECT_TRUE(torch::allclose(output_of(infer(service, "cnn", x)), second.reference(x), 1e-5, 1e-5));

  fs::create_directories(repository.path() / "cnn" / "3");
  write_file(repository.path() / "cnn" / "3" / "model.pt", "not a model");
  const std::string broken = (repository.path() / "cnn" / "3" / "model.pt").string();
  ASSERT_TRUE(eventually([&] { return Contains(index_of(service)[0].value("reason", ""), broken); }));
  EXPECT_EQ(index_of(service)[0]["state"], "READY");
  EXPECT_EQ(version_served(), "2");
  EXPECT_TRUE(torch::allclose(output_of(infer(service, "cnn", x)), second.reference(x), 1e-5, 1e-5));
  fs::remove_all(repository.path() / "cnn" / "3");  // version 2 is the latest again: reloaded, the failure gone
  ASSERT_TRUE(eventually([&] { return !index_of(service)[0].contains("reason"); }));
  EXPECT_EQ(version_served(), "2");

  CnnVersion other(repository.path(), "other", "1");
  ASSERT_TRUE(eventually([&] { return service.model_ready("other").status == 200; }));
  EXPECT_TRUE(torch::allclose(output_of(infer(service, "other", x)), other.reference(x), 1e-5, 1e-5));
  fs::remove_all(repository.path() / "other");
  ASSERT_TRUE(eventually([&] { return service.model_ready("other").status == 404; }));
  EXPECT_EQ(error_of(infer(service, "other", x)), "model 'other' is not loaded (removed from the repository)");

  std::lock_guard<std::mutex> lock(log_mutex);
  EXPECT_TRUE(Contains(log.at(0), "loaded model 'cnn' version 2")) << log.at(0);
  EXPECT_TRUE(Contains(log.at(1), "model 'cnn' not loaded: " + broken)) << log.at(1);
  EXPECT_TRUE(Contains(log.at(2), "loaded model 'cnn' version 2")) << log.at(2);
  EXPECT_TRUE(Contains(log.at(3), "loaded model 'other' version 1")) << log.at(3);
  EXPECT_TRUE(Contains(log.at(4), "unloaded model 'other' version 1 (removed from the repository)")) << log.at(4);
  EXPECT_EQ(log.size(), 5u);  // the broken version is not tried again until its files change
}

// The user's flow: a server started on version 1, the cnn a user wrote in Python copied in as
// version 2 and loaded on request; every answer from then on is PyTorch's, at batch 1, 2, 7 and
// 64, over JSON and binary, and on repeated calls.
TEST(ModelControl, AVersionLoadedOnRequestAnswersAsPyTorch) {
  const afterburner::testing::UserModel& python_cnn = afterburner::testing::user_model("cnn_scripted");
  TempDir repository;
  CnnVersion first(repository.path(), "cnn", "1");
  write_file(repository.path() / "cnn" / "config.toml", testing::cnn_config());  // the README's
  testing::ServerProcess server({"serve", "--repo", repository.path().string(), "--port", "0", "--model-control",
                                 "explicit", "--load-model", "cnn"});
  fs::create_directories(repository.path() / "cnn" / "2");
  fs::copy_file(python_cnn.file, repository.path() / "cnn" / "2" / "model.pt");
  testing::HttpClient client(server.port());
  const testing::HttpReply loaded = client.post("/v2/repository/models/cnn/load", "");
  ASSERT_EQ(loaded.status, 200) << loaded.body;
  EXPECT_EQ(nlohmann::json::parse(loaded.body)["version"], "2");
  for (bool binary : {false, true}) {
    auto runner = [&](const std::vector<at::Tensor>& inputs) {
      return std::vector<at::Tensor>{testing::infer(client, "cnn", {{"input", inputs.at(0)}}, binary).at(0).second};
    };
    const auto check = afterburner::testing::check_path(python_cnn, "serve, version 2 loaded on request", runner,
                                                        afterburner::testing::kExact);
    EXPECT_TRUE(check.passed) << (binary ? "binary: " : "JSON: ") << check.failure;
  }
  EXPECT_EQ(server.stop(), 0);
}

// The command: serve polls the repository it was given, and says what it loaded.
TEST(ModelControl, ServeCommandPollsItsRepository) {
  TempDir repository;
  CnnVersion first(repository.path(), "cnn", "1");
  testing::ServerProcess server({"serve", "--repo", repository.path().string(), "--port", "0", "--model-control", "poll",
                                 "--repository-poll-secs", "0.2"});
  testing::HttpClient client(server.port());
  CnnVersion second(repository.path(), "cnn", "2");
  ASSERT_TRUE(eventually([&] { return client.get("/v2/models/cnn/versions/2/ready").status == 200; }));
  const at::Tensor x = torch::randn({5, 1, 28, 28});
  for (int call = 0; call < 2; ++call) {
    auto outputs = testing::infer(client, "cnn", {{"input", x}}, /*binary=*/call == 1);
    EXPECT_TRUE(torch::allclose(outputs.at(0).second, second.reference(x), 1e-5, 1e-5));
  }
  EXPECT_EQ(nlohmann::json::parse(client.get("/v2").body)["extensions"],
            nlohmann::json({"binary_tensor_data", "model_repository"}));
  EXPECT_EQ(client.post("/v2/repository/models/cnn/load", "").status, 400);
  EXPECT_EQ(server.stop(), 0);

  auto bad = afterburner::testing::run_cli({"serve", "--repo", repository.path().string(), "--model-control", "auto"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(Contains(bad.err, "afterburner: --model-control: 'auto' is not one of none, poll, explicit")) << bad.err;
  auto stray = afterburner::testing::run_cli({"serve", "--repo", repository.path().string(), "--load-model", "cnn"});
  EXPECT_EQ(stray.exit_code, 2);
  EXPECT_TRUE(Contains(stray.err, "afterburner: --load-model: takes effect with --model-control explicit only"));
}

}  // namespace
}  // namespace afterburner::serve
