// load_model/save_model: bad files give one-line errors naming the file; writes are atomic.
#include "afterburner/infer/model_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_models.h"
#include "testing.h"
#include "user_models.h"

namespace afterburner::testing {
namespace {

std::string load_error(const std::filesystem::path& path) {
  return error_message<infer::ModelError>([&] { infer::load_model(path.string()); });
}

void expect_names_file_in_one_line(const std::string& message, const std::filesystem::path& path) {
  EXPECT_TRUE(Contains(message, path.string()));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(ModelFile, MissingFileIsNamed) {
  TempDir dir;
  auto message = load_error(dir / "absent.pt");
  expect_names_file_in_one_line(message, dir / "absent.pt");
  EXPECT_TRUE(Contains(message, "no such model file"));
}

TEST(ModelFile, DirectoryIsNamed) {
  TempDir dir;
  auto message = load_error(dir.path());
  expect_names_file_in_one_line(message, dir.path());
  EXPECT_TRUE(Contains(message, "not a regular file"));
}

TEST(ModelFile, NonTorchScriptFilesAreNamed) {
  TempDir dir;
  write_file(dir / "text.pt", "this is not a model\n");
  write_file(dir / "empty.pt", "");
  // A zip archive, but of something else.
  write_file(dir / "zip.pt", std::string("PK\x03\x04", 4) + std::string(64, '\0'));
  for (const auto* name : {"text.pt", "empty.pt", "zip.pt"}) {
    auto message = load_error(dir / name);
    expect_names_file_in_one_line(message, dir / name);
    EXPECT_TRUE(Contains(message, "not a loadable TorchScript model")) << name;
  }
}

TEST(ModelFile, TruncatedAndCorruptedModelsAreNamed) {
  TempDir dir;
  infer::save_model(conv_bn_dropout_model(), (dir / "good.pt").string());
  const auto bytes = read_file(dir / "good.pt");
  write_file(dir / "truncated.pt", bytes.substr(0, bytes.size() / 2));
  auto corrupted = bytes;
  for (size_t i = bytes.size() / 4; i < bytes.size(); i += 7) corrupted[i] = static_cast<char>(corrupted[i] ^ 0x5a);
  write_file(dir / "corrupted.pt", corrupted);
  for (const auto* name : {"truncated.pt", "corrupted.pt"}) {
    expect_names_file_in_one_line(load_error(dir / name), dir / name);
  }
}

TEST(ModelFile, SaveLoadRoundTripKeepsOutputs) {
  TempDir dir;
  auto model = conv_bn_dropout_model();
  model.eval();
  infer::save_model(model, (dir / "model.pt").string());
  auto loaded = infer::load_model((dir / "model.pt").string());
  auto input = torch::randn({2, 1, 8, 8});
  EXPECT_TRUE(torch::equal(loaded.forward({input}).toTensor(), model.forward({input}).toTensor()));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "no temporary left";
}

TEST(ModelFile, UnwritablePathIsNamedAndLeavesNothing) {
  TempDir dir;
  const auto path = dir / "missing-dir" / "model.pt";
  auto message = error_message<infer::ModelError>([&] { infer::save_model(conv_bn_dropout_model(), path.string()); });
  expect_names_file_in_one_line(message, path);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// shared_weights_flat, as Python saved it: two Linear layers holding one weight Parameter, and
// every parameter and buffer a view of one storage.
TEST(ModelFile, CopyKeepsTiesAndViewsAndSharesNothing) {
  const UserModel& user = user_model("shared_weights_flat");
  auto original = infer::load_model(user.file.string());
  const auto before = original.named_parameters();
  std::vector<torch::Tensor> saved;
  for (const auto& parameter : before) saved.push_back(parameter.value.clone());

  auto copy = infer::copy_model(original);
  auto x = user.batches.at(7).inputs.at(0);
  EXPECT_TRUE(torch::equal(copy.forward({x}).toTensor(), original.forward({x}).toTensor()));
  const auto parameters = copy.named_parameters();
  ASSERT_EQ(parameters.size(), before.size());
  const auto& first = copy.attr("first").toModule().attr("weight").toTensor();
  EXPECT_TRUE(first.is_same(copy.attr("second").toModule().attr("weight").toTensor())) << "the tie is kept";
  const auto storage = (*parameters.begin()).value.storage().unsafeGetStorageImpl();
  size_t i = 0;
  for (const auto& parameter : parameters) {
    const torch::Tensor& original_parameter = saved.at(i++);
    EXPECT_TRUE(torch::equal(parameter.value, original_parameter)) << parameter.name;
    EXPECT_EQ(parameter.value.storage().unsafeGetStorageImpl(), storage) << parameter.name << " in the one new storage";
    EXPECT_TRUE(parameter.value.requires_grad()) << parameter.name;
  }
  // The copy's storage is its own: writing through it leaves the original as it was.
  torch::NoGradGuard no_grad;
  for (const auto& parameter : parameters) parameter.value.fill_(7);
  i = 0;
  for (const auto& parameter : before) {
    EXPECT_TRUE(torch::equal(parameter.value, saved.at(i++))) << parameter.name;
    EXPECT_NE(parameter.value.storage().unsafeGetStorageImpl(), storage) << parameter.name;
  }
}

}  // namespace
}  // namespace afterburner::testing
