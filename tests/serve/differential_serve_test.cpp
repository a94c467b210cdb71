// Every model of the differential corpus (tests/infer/user_models.py: written in Python the way
// users write them) served over HTTP on loopback, through the JSON and the binary tensor
// codecs, compared with Python's outputs at batch sizes 1, 2, 7 and 64 and after 100 more
// requests (tests/infer/user_models.h), within 1e-5 absolute + 1e-5 relative; over the binary
// codec also the rows holding NaN and infinities. Rows go to <build>/differential-report.md.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <thread>

#include "afterburner/serve/http_server.h"
#include "afterburner/serve/model_service.h"
#include "afterburner/serve/protocol.h"
#include "http_client.h"
#include "infer/user_models.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Batch;
using afterburner::testing::TempDir;
using afterburner::testing::UserModel;

std::string datatype_of(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return "FP32";
    case at::kLong: return "INT64";
    default: throw std::runtime_error("no datatype for " + std::string(c10::toString(tensor.scalar_type())));
  }
}

// [[input]] / [[output]] tables named input0, input1, ... and output0, ... from Python's batch.
std::string tensor_tables(const char* kind, const std::vector<at::Tensor>& tensors) {
  std::string tables;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto dims = tensors[i].sizes().slice(1);
    tables += fmt::format("[[{}]]\nname = \"{}{}\"\ndatatype = \"{}\"\ndims = [{}]\n", kind, kind, i,
                          datatype_of(tensors[i]), fmt::join(dims, ", "));
  }
  return tables;
}

// max_batch_size 64 for the largest batch; a short queue delay, since the corpus sends one
// request at a time and would otherwise wait for a fuller batch every time.
std::string corpus_config(const UserModel& model) {
  const Batch& batch = model.batches.at(64);
  return "max_batch_size = 64\nmax_queue_delay_us = 100\ninstances = 1\n" + tensor_tables("input", batch.inputs) +
         tensor_tables("output", batch.outputs);
}

// A repository of the whole corpus, served by ModelService and HttpServer on an ephemeral
// loopback port: what `afterburner serve --repo DIR --port 0` runs.
class CorpusServer {
 public:
  CorpusServer() {
    for (const auto& name : afterburner::testing::user_model_names()) {
      const UserModel& model = afterburner::testing::user_model(name);
      std::filesystem::create_directories(repository_ / name);
      std::filesystem::copy_file(model.file, repository_ / name / "model.pt");
      afterburner::testing::write_file(repository_ / name / "config.toml", corpus_config(model));
    }
    service_ = std::make_unique<ModelService>(repository_.path().string());
    server_ = std::make_unique<HttpServer>(*service_, HttpOptions().port(0));
    thread_ = std::thread([this] { server_->run(); });
  }
  ~CorpusServer() {
    server_->stop();
    thread_.join();
  }
  int port() const { return server_->port(); }

 private:
  TempDir repository_;
  std::unique_ptr<ModelService> service_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

class DifferentialServe : public ::testing::TestWithParam<std::string> {};

TEST_P(DifferentialServe, EveryModelAnswersAsPython) {
  const bool binary = GetParam() == "Binary";
  CorpusServer server;
  testing::HttpClient client(server.port());
  for (const auto& name : afterburner::testing::user_model_names()) {
    const UserModel& model = afterburner::testing::user_model(name);
    auto runner = [&](const std::vector<at::Tensor>& inputs) {
      std::vector<NamedTensor> named;
      for (size_t i = 0; i < inputs.size(); ++i) named.emplace_back(fmt::format("input{}", i), inputs[i]);
      std::vector<at::Tensor> outputs;
      for (auto& [output_name, tensor] : testing::infer(client, name, named, binary)) {
        if (output_name != fmt::format("output{}", outputs.size())) throw std::runtime_error("output " + output_name);
        outputs.push_back(tensor);
      }
      return outputs;
    };
    auto check = afterburner::testing::check_path(model, binary ? "serve binary" : "serve JSON", runner,
                                                  afterburner::testing::kExact);
    EXPECT_TRUE(check.passed) << name << ": " << check.failure;
    if (!binary) continue;  // JSON has no NaN or infinity
    auto non_finite = afterburner::testing::check_non_finite(model, "serve binary", runner, afterburner::testing::kExact);
    EXPECT_TRUE(non_finite.passed) << name << ": " << non_finite.failure;
  }
}

INSTANTIATE_TEST_SUITE_P(Differential, DifferentialServe, ::testing::Values("Json", "Binary"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace afterburner::serve
