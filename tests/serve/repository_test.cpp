#include "afterburner/serve/repository.h"

#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "cnn_repository.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::error_message;
using afterburner::testing::TempDir;
using afterburner::testing::write_file;

// The config of the issue, as written there.
const std::string kIssueConfig = testing::cnn_config();

std::filesystem::path write_model(const TempDir& dir, const std::string& name, const std::string& config) {
  std::filesystem::path model_dir = dir / name;
  std::filesystem::create_directories(model_dir);
  write_file(model_dir / "config.toml", config);
  write_file(model_dir / "model.pt", "not read by the config loader");
  return model_dir;
}

TEST(Repository, ReadsTheIssueConfig) {
  TempDir dir;
  ModelConfig config = load_model_config(write_model(dir, "cnn", kIssueConfig));
  EXPECT_EQ(config.name, "cnn");
  EXPECT_EQ(config.model_file, dir / "cnn" / "model.pt");
  EXPECT_EQ(config.max_batch_size, 64);
  EXPECT_EQ(config.max_queue_delay_us, 2000);
  EXPECT_EQ(config.preferred_batch_sizes, (std::vector<int64_t>{16, 32, 64}));
  EXPECT_EQ(config.instances, 1);
  EXPECT_TRUE(config.dynamic_batching);
  EXPECT_EQ(config.queue_capacity(), 2 * 64);
  ASSERT_EQ(config.inputs.size(), 1u);
  EXPECT_EQ(config.inputs[0].name, "input");
  EXPECT_EQ(config.inputs[0].datatype, DataType::FP32);
  EXPECT_EQ(config.inputs[0].dims, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_TRUE(config.inputs[0].allow_non_finite) << "NaN and infinities pass, as in Python";
  ASSERT_EQ(config.outputs.size(), 1u);
  EXPECT_EQ(config.outputs[0].name, "output");
  EXPECT_EQ(config.outputs[0].dims, (std::vector<int64_t>{10}));
}

TEST(Repository, ReadsOptionalKeysAndSortsPreferredSizes) {
  TempDir dir;
  ModelConfig config = load_model_config(write_model(dir, "m", R"(max_batch_size = 8
preferred_batch_sizes = [8, 2, 4, 2]
dynamic_batching = false
instances = 2
max_queue_size = 5
timeout_us = 1000
[[input]]
name = "a"
datatype = "INT64"
dims = [-1]
[[input]]
name = "b"
datatype = "UINT8"
dims = [3]
[[input]]
name = "c"
datatype = "FP16"
dims = [3]
allow_non_finite = false
[[output]]
name = "y"
datatype = "FP64"
dims = [2]
)"));
  EXPECT_EQ(config.preferred_batch_sizes, (std::vector<int64_t>{2, 4, 8}));
  EXPECT_FALSE(config.dynamic_batching);
  EXPECT_EQ(config.instances, 2);
  EXPECT_EQ(config.queue_capacity(), 5);
  EXPECT_EQ(config.timeout_us, 1000);
  ASSERT_EQ(config.inputs.size(), 3u);
  EXPECT_FALSE(config.inputs[2].allow_non_finite);
  EXPECT_EQ(config.inputs[0].datatype, DataType::INT64);
  EXPECT_EQ(config.inputs[0].dims, (std::vector<int64_t>{-1}));
  EXPECT_EQ(config.inputs[1].datatype, DataType::UINT8);
  EXPECT_EQ(config.outputs[0].datatype, DataType::FP64);
}

TEST(Repository, DatatypeNamesRoundTrip) {
  for (const char* name : {"BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"}) {
    auto type = parse_datatype(name);
    ASSERT_TRUE(type) << name;
    EXPECT_EQ(datatype_name(*type), name);
  }
  EXPECT_FALSE(parse_datatype("BYTES"));
  EXPECT_EQ(datatype_size(DataType::FP16), 2u);
  EXPECT_EQ(datatype_size(DataType::INT64), 8u);
}

struct BadConfig {
  std::string replace;  // text of kIssueConfig to replace
  std::string with;
  std::string key;      // what the message must name after the file
  std::string problem;
};

TEST(Repository, EachBadKeyIsNamedWithItsFile) {
  const std::vector<BadConfig> cases = {
      {"max_batch_size = 64\nmax_queue_delay_us = 2000\npreferred_batch_sizes = [16, 32, 64]", "max_batch_size = 0",
       "max_batch_size", "at least 1"},
      {"max_batch_size = 64", "max_batch_size = \"64\"", "max_batch_size", "must be an integer"},
      {"max_batch_size = 64", "max_batch_size = 64.5", "max_batch_size", "must be an integer"},
      {"max_queue_delay_us = 2000", "max_queue_delay_us = -1", "max_queue_delay_us", "at least 0"},
      {"[16, 32, 64]", "[16, 128]", "preferred_batch_sizes", "128 exceeds max_batch_size 64"},
      {"[16, 32, 64]", "[0]", "preferred_batch_sizes", "at least 1"},
      {"[16, 32, 64]", "\"16\"", "preferred_batch_sizes", "array of integers"},
      {"[16, 32, 64]", "[16, \"32\"]", "preferred_batch_sizes", "array of integers"},
      {"instances = 1", "instances = 0", "instances", "at least 1"},
      {"instances = 1", "instances = 1\ntimeout_us = 0", "timeout_us", "at least 1"},
      {"instances = 1", "instances = 1\nmax_queue_size = 0", "max_queue_size", "at least 1"},
      {"instances = 1", "instances = 1\ndynamic_batching = 1", "dynamic_batching", "true or false"},
      {"instances = 1", "instances = 1\nmax_batch = 3", "max_batch", "unknown key"},
      {"datatype = \"FP32\"\ndims = [1", "datatype = \"FP8\"\ndims = [1", "input[0].datatype", "must be one of"},
      {"dims = [1, 28, 28]", "dims = [1, 0, 28]", "input[0].dims", "at least 1 or -1"},
      {"dims = [1, 28, 28]", "", "input[0].dims", "missing"},
      {"name = \"input\"", "", "input[0].name", "missing"},
      {"name = \"input\"", "name = \"\"", "input[0].name", "non-empty string"},
      {"name = \"input\"", "name = \"input\"\nshape = [1]", "input[0].shape", "unknown key"},
      {"dims = [1, 28, 28]", "dims = [1, 28, 28]\nallow_non_finite = \"no\"", "input[0].allow_non_finite",
       "true or false"},
      {"datatype = \"FP32\"\ndims = [1, 28, 28]", "datatype = \"INT64\"\ndims = [1, 28, 28]\nallow_non_finite = false",
       "input[0].allow_non_finite", "applies to FP16, FP32 and FP64 inputs, 'input' is INT64"},
      {"dims = [10]", "dims = [10]\nallow_non_finite = false", "output[0].allow_non_finite", "unknown key"},
      {"dims = [10]", "dims = [10]\n[[output]]\nname = \"output\"\ndatatype = \"FP32\"\ndims = [1]", "output[1].name",
       "duplicate name 'output'"},
      {"[[output]]\nname = \"output\"\ndatatype = \"FP32\"\ndims = [10]\n", "", "output", "missing"},
      {"[[input]]\nname = \"input\"\ndatatype = \"FP32\"\ndims = [1, 28, 28]", "input = 3", "input", "[[input]] tables"},
  };
  for (const auto& bad : cases) {
    std::string config = kIssueConfig;
    auto at = config.find(bad.replace);
    ASSERT_NE(at, std::string::npos) << bad.replace;
    config.replace(at, bad.replace.size(), bad.with);
    TempDir dir;
    auto model_dir = write_model(dir, "cnn", config);
    std::string message = error_message<UsageError>([&] { load_model_config(model_dir); });
    std::string file = (model_dir / "config.toml").string();
    EXPECT_TRUE(Contains(message, file + ": " + bad.key + ": ")) << config;
    EXPECT_TRUE(Contains(message, bad.problem)) << config;
  }
}

TEST(Repository, SyntaxErrorNamesFileLineAndColumn) {
  TempDir dir;
  auto model_dir = write_model(dir, "cnn", "max_batch_size = = 3\n");
  std::string message = error_message<DataError>([&] { load_model_config(model_dir); });
  EXPECT_TRUE(Contains(message, (model_dir / "config.toml").string() + ":1:"));
  // toml++ quotes the bytes it choked on, here a newline: the message stays one line.
  write_model(dir, "cnn", "dynamic_batching = f\n");
  message = error_message<DataError>([&] { load_model_config(model_dir); });
  EXPECT_TRUE(Contains(message, (model_dir / "config.toml").string() + ":1:")) << message;
  EXPECT_FALSE(Contains(message, "\n")) << message;
}

TEST(Repository, MissingFilesAreNamed) {
  TempDir dir;
  auto model_dir = write_model(dir, "cnn", kIssueConfig);
  std::filesystem::remove(model_dir / "model.pt");
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_model_config(model_dir); }),
                       (model_dir / "model.pt").string() + ": no such model file"));
  std::filesystem::remove(model_dir / "config.toml");
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_model_config(model_dir); }),
                       (model_dir / "config.toml").string() + ": no such model config"));
}

TEST(Repository, LoadsEveryModelDirectoryByName) {
  TempDir dir;
  write_model(dir, "zeta", kIssueConfig);
  write_model(dir, "alpha", kIssueConfig);
  write_file(dir / "README", "files beside the models are not models");
  Repository repository = load_repository(dir.path());
  ASSERT_EQ(repository.models.size(), 2u);
  EXPECT_EQ(repository.models[0].name, "alpha");
  EXPECT_EQ(repository.models[1].name, "zeta");
}

// Triton's layout: numbered version directories, the highest served (numerically: 10 after 9).
TEST(Repository, TheHighestVersionDirectoryIsServed) {
  TempDir dir;
  auto model_dir = write_model(dir, "cnn", kIssueConfig);
  EXPECT_EQ(load_model_config(model_dir).version, "1");
  std::filesystem::remove(model_dir / "model.pt");
  for (const char* version : {"1", "9", "10"}) {
    std::filesystem::create_directories(model_dir / version);
    write_file(model_dir / version / "model.pt", version);
  }
  std::filesystem::create_directories(model_dir / "notes");  // not a version
  std::filesystem::create_directories(model_dir / "11x");
  ModelConfig config = load_model_config(model_dir);
  EXPECT_EQ(config.version, "10");
  EXPECT_EQ(config.model_file, model_dir / "10" / "model.pt");
  EXPECT_EQ(config.config_file, model_dir / "config.toml");

  std::filesystem::create_directories(model_dir / "12");  // a version on its way, without its file yet
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_model_config(model_dir); }),
                       (model_dir / "12" / "model.pt").string() + ": no such model file"));
  write_file(model_dir / "model.pt", "the flat layout too");
  EXPECT_EQ(error_message<DataError>([&] { load_model_config(model_dir); }),
            model_dir.string() + ": holds both model.pt and version directories: keep one layout");
}

// A stamp changes with what a poll must notice: the model file's content, a new version.
TEST(Repository, StampsChangeWithTheFiles) {
  TempDir dir;
  auto model_dir = write_model(dir, "cnn", kIssueConfig);
  const std::string flat = locate_model_files(model_dir).stamp();
  EXPECT_EQ(locate_model_files(model_dir).stamp(), flat);
  write_file(model_dir / "model.pt", "other weights, of another size");
  const std::string rewritten = locate_model_files(model_dir).stamp();
  EXPECT_NE(rewritten, flat);
  std::filesystem::remove(model_dir / "model.pt");
  std::filesystem::create_directories(model_dir / "2");
  EXPECT_TRUE(Contains(locate_model_files(model_dir).stamp(), (model_dir / "2" / "model.pt").string() + " missing"));
  write_file(model_dir / "2" / "model.pt", "version 2");
  EXPECT_NE(locate_model_files(model_dir).stamp(), rewritten);
  EXPECT_EQ(list_models(dir.path()), std::vector<std::string>{"cnn"});
}

TEST(Repository, MissingOrEmptyRepositoryIsNamed) {
  TempDir dir;
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_repository(dir / "absent"); }),
                       (dir / "absent").string() + ": no such model repository"));
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_repository(dir.path()); }),
                       dir.path().string() + ": no models"));
}

}  // namespace
}  // namespace afterburner::serve
