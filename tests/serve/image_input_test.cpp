#include "afterburner/serve/image_input.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/script.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/serve/protocol.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::error_message;
using afterburner::testing::TempDir;
using afterburner::testing::write_file;

const char* kImageConfig = R"(max_batch_size = 4
[[input]]
name = "input"
datatype = "FP32"
dims = [3, 32, 32]
format = "image"
[[output]]
name = "output"
datatype = "FP32"
dims = [2]
)";

// DIR/m with `config` and a TorchScript model.pt carrying `metadata` as its afterburner.json.
std::filesystem::path write_image_model(const TempDir& dir, const std::string& config, const std::string& metadata) {
  const std::filesystem::path model_dir = dir / "m";
  std::filesystem::create_directories(model_dir);
  write_file(model_dir / "config.toml", config);
  torch::jit::Module module("m");
  module.define("def forward(self, x):\n  return x.mean([2, 3])[:, :2]\n");
  infer::save_model(module, (model_dir / "model.pt").string(), metadata);
  return model_dir;
}

const std::string kExported = nlohmann::json{{"classes", {"cat", "dog"}},
                                             {"input",
                                              {{"shape", {3, 32, 32}},
                                               {"mean", {0.5, 0.4, 0.3}},
                                               {"std", {0.2, 0.25, 0.3}},
                                               {"transforms", "resize40,centre32"}}}}
                                  .dump();

TEST(ImageInput, TheExportedMetadataFillsWhatTheConfigLeavesOut) {
  TempDir dir;
  const ModelConfig exported = load_model_config(write_image_model(dir, kImageConfig, kExported));
  ASSERT_TRUE(exported.image);
  EXPECT_EQ(exported.image->transforms, "resize40,centre32");
  EXPECT_EQ(exported.image->mean, (std::vector<double>{0.5, 0.4, 0.3}));
  EXPECT_EQ(exported.image->std, (std::vector<double>{0.2, 0.25, 0.3}));
  EXPECT_EQ(exported.image->classes, (std::vector<std::string>{"cat", "dog"}));

  std::string config = kImageConfig;
  config.replace(config.find("format"), 0, "mean = [0.5]\nstd = [0.25]\nclasses_file = \"names.txt\"\n");
  const std::filesystem::path model_dir = write_image_model(dir, config, kExported);
  write_file(model_dir / "names.txt", "tabby\r\n\nbeagle\n");
  const ModelConfig overridden = load_model_config(model_dir);
  EXPECT_EQ(overridden.image->mean, (std::vector<double>{0.5}));
  EXPECT_EQ(overridden.image->classes, (std::vector<std::string>{"tabby", "beagle"}));

  const ModelConfig bare = load_model_config(write_image_model(dir, kImageConfig, ""));  // no metadata
  EXPECT_EQ(bare.image->transforms, "resize36,centre32");                                // 32 * 256 / 224
  EXPECT_TRUE(bare.image->mean.empty() && bare.image->classes.empty());
  std::string tensors = kImageConfig;
  tensors.erase(tensors.find("format = \"image\"\n"), 17);
  EXPECT_FALSE(load_model_config(write_image_model(dir, tensors, "")).image);  // takes tensors
}

TEST(ImageInput, EachBadImageKeyIsNamedWithItsFile) {
  const std::vector<std::tuple<std::string, std::string, std::string, std::string>> cases{
      {"format = \"image\"", "format = \"jpeg\"", "input[0].format", "must be tensor or image"},
      {"dims = [3, 32, 32]", "dims = [2, 32, 32]", "input[0].dims", "[C, S, S] with C 1 or 3"},
      {"dims = [3, 32, 32]", "dims = [3, 32, 30]", "input[0].dims", "[C, S, S]"},
      {"datatype = \"FP32\"\ndims = [3", "datatype = \"FP16\"\ndims = [3", "input[0].datatype", "is FP32"},
      {"format = \"image\"", "format = \"image\"\ntransforms = \"blur\"", "input[0].transforms", "'blur'"},
      {"format = \"image\"", "format = \"image\"\nmean = [0.5, 0.5]\nstd = [0.5, 0.5]", "input[0].mean",
       "2 means and 2 stds for 3 channels"},
      {"format = \"image\"", "format = \"image\"\nmean = [0.5]\nstd = [0]", "input[0].std", "not positive"},
      {"format = \"image\"", "format = \"image\"\nmean = [\"a\"]", "input[0].mean", "array of numbers"},
      {"format = \"image\"", "format = \"image\"\nclasses_file = \"absent.txt\"", "input[0].classes_file",
       "cannot read"},
      {"format = \"image\"", "transforms = \"rrc32\"", "input[0].transforms", "format = \"image\""},
      {"[[output]]", "[[input]]\nname = \"second\"\ndatatype = \"FP32\"\ndims = [1]\n[[output]]", "input[0].format",
       "the model's only input"},
  };
  for (const auto& [replace, with, key, problem] : cases) {
    std::string config = kImageConfig;
    config.replace(config.find(replace), replace.size(), with);
    TempDir dir;
    const std::filesystem::path model_dir = write_image_model(dir, config, "");
    const std::string message = error_message<UsageError>([&] { load_model_config(model_dir); });
    EXPECT_TRUE(Contains(message, (model_dir / "config.toml").string() + ": " + key + ": ")) << message;
    EXPECT_TRUE(Contains(message, problem)) << message;
  }
  TempDir dir;
  const std::string wrong_shape = nlohmann::json{{"input", {{"shape", {1, 28, 28}}, {"mean", {0}}, {"std", {1}}}}}.dump();
  std::string message = error_message<UsageError>([&] { load_model_config(write_image_model(dir, kImageConfig, wrong_shape)); });
  EXPECT_TRUE(Contains(message, "input[0].dims: [3, 32, 32], but ")) << message;
  EXPECT_TRUE(Contains(message, "was trained on [1, 28, 28] inputs")) << message;
  std::string three_names = kImageConfig;
  three_names.replace(three_names.find("format"), 0, "classes_file = \"names.txt\"\n");
  const std::filesystem::path model_dir = write_image_model(dir, three_names, "");
  write_file(model_dir / "names.txt", "a\nb\nc\n");
  message = error_message<UsageError>([&] { load_model_config(model_dir); });
  EXPECT_TRUE(Contains(message, "3 class names for the 2 scores of output 'output'")) << message;
}

TEST(ImageInput, MultipartBodiesSplitIntoTheirPartsBytesAsSent) {
  const std::string first("\xff\xd8 binary\r\nwith CRLF and --b inside\0", 34);
  const std::string body = "preamble\r\n--b0undary\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n" + first +
                           "\r\n--b0undary\r\nContent-Type: image/png\r\n\r\nsecond\r\n--b0undary--\r\nepilogue";
  const std::vector<std::string> parts = multipart_parts(body, "multipart/form-data; boundary=\"b0undary\"");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], first);
  EXPECT_EQ(parts[1], "second");
  EXPECT_EQ(multipart_parts(body, "Multipart/Form-Data; charset=x; boundary=b0undary").size(), 2u);
  for (const auto& [text, type, problem] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {body, "multipart/form-data", "names no boundary"},
           {body, "multipart/form-data; boundary=other", "no part starts with --other"},
           {"--b\r\nno end of headers", "multipart/form-data; boundary=b", "part 1 has no end of headers"},
           {"--b\r\n\r\nunterminated", "multipart/form-data; boundary=b", "part 1 is not terminated"},
           {"--bX", "multipart/form-data; boundary=b", "not followed by CRLF"},
           {"--b--\r\n", "multipart/form-data; boundary=b", "no part"}}) {
    const std::string body = text, content_type = type;  // clang 14 lambdas cannot capture structured bindings
    const RequestError error = [&] {
      try {
        multipart_parts(body, content_type);
      } catch (const RequestError& e) {
        return e;
      }
      return RequestError(0, "no error");
    }();
    EXPECT_EQ(error.status(), 400) << problem;
    EXPECT_TRUE(Contains(error.what(), problem)) << error.what();
  }
  EXPECT_TRUE(is_image_content_type("image/jpeg") && is_image_content_type("Image/PNG; q=1"));
  EXPECT_FALSE(is_image_content_type("application/json") || is_multipart_content_type("multipart/mixed"));
}

TEST(ImageInput, TheResponseAddsEachImagesTopClassesByProbability) {
  TempDir dir;
  ModelConfig config = load_model_config(write_image_model(dir, kImageConfig, kExported));
  const torch::Tensor logits = torch::tensor({{0.5f, 2.0f}, {1.0f, 1.0f}});
  const Reply reply = encode_image_response(config, {logits}, 5);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const nlohmann::json answer = nlohmann::json::parse(reply.body);
  EXPECT_EQ(answer["outputs"][0]["data"].get<std::vector<float>>(), (std::vector<float>{0.5f, 2.0f, 1.0f, 1.0f}));
  const nlohmann::json& first = answer["classes"][0];
  ASSERT_EQ(first.size(), 2u);  // top 5 of 2 classes
  EXPECT_EQ(first[0]["name"], "dog");
  EXPECT_NEAR(first[0]["probability"].get<double>(), 1 / (1 + std::exp(-1.5)), 1e-12);
  EXPECT_EQ(answer["classes"][1][0]["index"], 0);  // a tie: the lower index first
  EXPECT_EQ(nlohmann::json::parse(encode_image_response(config, {logits}, 1).body)["classes"][0].size(), 1u);
}

}  // namespace
}  // namespace afterburner::serve
