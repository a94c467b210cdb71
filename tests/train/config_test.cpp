#include <gtest/gtest.h>

#include "afterburner/core/error.h"
#include "afterburner/train/config.h"
#include "testing.h"

namespace afterburner::train {
namespace {

std::string usage_error_of(const std::function<void()>& action) {
  return testing::error_message<UsageError>(action);
}

}  // namespace

TEST(Config, EveryFieldRoundTripsThroughItsText) {
  TrainConfig config;
  for (const auto& field : config_fields()) {
    TrainConfig copy;
    field.set(copy, field.get(config));
    EXPECT_EQ(field.get(copy), field.get(config)) << field.name;
  }
}

TEST(Config, SetsTypedValues) {
  TrainConfig config;
  set_field(config, "batch_size", "256");
  set_field(config, "lr", "0.125");
  set_field(config, "workers", "auto");
  set_field(config, "nesterov", "false");
  set_field(config, "checkpoint_layers", "1,3");
  EXPECT_EQ(config.batch_size, 256);
  EXPECT_DOUBLE_EQ(config.lr, 0.125);
  EXPECT_EQ(config.workers, -1);
  EXPECT_FALSE(config.nesterov);
  EXPECT_EQ(config.checkpoint_layers, (std::vector<int64_t>{1, 3}));
}

TEST(Config, BadValuesNameTheFlag) {
  TrainConfig config;
  EXPECT_NE(usage_error_of([&] { set_field(config, "batch_size", "12x"); }).find("--batch-size"), std::string::npos);
  EXPECT_NE(usage_error_of([&] { set_field(config, "batch_size", "0"); }).find("at least 1"), std::string::npos);
  EXPECT_NE(usage_error_of([&] { set_field(config, "precision", "fp8"); }).find("--precision"), std::string::npos);
  EXPECT_NE(usage_error_of([&] { set_field(config, "target_accuracy", "1.5"); }).find("--target-accuracy"),
            std::string::npos);
  EXPECT_NE(usage_error_of([&] { set_field(config, "workers", "-2"); }).find("--workers"), std::string::npos);
  EXPECT_NE(usage_error_of([&] { set_field(config, "colour", "red"); }).find("colour"), std::string::npos);
}

TEST(Config, TomlFileSetsFieldsOverTheDefaults) {
  testing::TempDir dir;
  auto path = dir / "run.toml";
  testing::write_file(path, "model = \"mlp\"\nbatch_size = 64\nlr = 0.2\nnesterov = true\n"
                            "checkpoint_layers = [0, 2]\nworkers = \"auto\"\n");
  TrainConfig config;
  apply_toml_file(config, path.string());
  EXPECT_EQ(config.model, "mlp");
  EXPECT_EQ(config.batch_size, 64);
  EXPECT_DOUBLE_EQ(config.lr, 0.2);
  EXPECT_TRUE(config.nesterov);
  EXPECT_EQ(config.checkpoint_layers, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(config.workers, -1);
  EXPECT_EQ(config.epochs, TrainConfig().epochs);
}

TEST(Config, TomlOfAConfigReadsBackToTheSameConfig) {
  TrainConfig config;
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"model", "mlp"}, {"lr", "0.1875"}, {"weight_decay", "1e-05"}, {"nesterov", "true"},
           {"augment", "false"}, {"workers", "auto"}, {"checkpoint_layers", "0,2"}, {"validation_split", "0.1"},
           {"report", "a \"quoted\" path\\with 'quotes'.json"}, {"seed", "7"}}) {
    set_field(config, name, value);
  }
  testing::TempDir dir;
  auto path = dir / "config.toml";
  testing::write_file(path, to_toml(config));
  TrainConfig read;
  apply_toml_file(read, path.string());
  for (const auto& field : config_fields()) EXPECT_EQ(field.get(read), field.get(config)) << field.name;
}

TEST(Config, TomlRelativeToTheDefaultsListsOnlyWhatDiffers) {
  TrainConfig config;
  set_field(config, "lr", "0.25");
  set_field(config, "augment", config.augment ? "false" : "true");
  const TrainConfig defaults;
  auto text = to_toml(config, &defaults);
  EXPECT_EQ(text, "lr = 0.25\naugment = " + std::string(config.augment ? "true" : "false") + "\n");
  EXPECT_EQ(to_toml(defaults, &defaults), "");
}

TEST(Config, ValidationSplitIsAFractionOfAtMostHalf) {
  TrainConfig config;
  set_field(config, "validation_split", "0.2");
  EXPECT_DOUBLE_EQ(config.validation_split, 0.2);
  EXPECT_NE(usage_error_of([&] { set_field(config, "validation_split", "0.6"); }).find("--validation-split"),
            std::string::npos);
  EXPECT_NE(usage_error_of([&] { set_field(config, "validation_split", "-0.1"); }).find("--validation-split"),
            std::string::npos);
}

TEST(Config, TomlErrorsNameTheFileAndKeyOrLine) {
  testing::TempDir dir;
  auto path = (dir / "run.toml").string();
  TrainConfig config;
  testing::write_file(path, "batch_sise = 64\n");
  auto unknown = usage_error_of([&] { apply_toml_file(config, path); });
  EXPECT_NE(unknown.find(path), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("batch_sise"), std::string::npos) << unknown;
  testing::write_file(path, "batch_size = \"many\"\n");
  auto bad = usage_error_of([&] { apply_toml_file(config, path); });
  EXPECT_NE(bad.find(path), std::string::npos) << bad;
  EXPECT_NE(bad.find("batch_size"), std::string::npos) << bad;  // the file's key, not the flag
  testing::write_file(path, "lr = 0.1\nepochs = = 3\n");
  auto syntax = usage_error_of([&] { apply_toml_file(config, path); });
  EXPECT_NE(syntax.find(path + ":2"), std::string::npos) << syntax;
  // Found by fuzzing: toml++ quotes the bytes it choked on, a newline among them.
  testing::write_file(path, "nesterov = t\n");
  auto quoted = usage_error_of([&] { apply_toml_file(config, path); });
  EXPECT_NE(quoted.find(path + ":1:"), std::string::npos) << quoted;
  EXPECT_EQ(quoted.find('\n'), std::string::npos) << quoted;
  EXPECT_NE(quoted.find("\\x0a"), std::string::npos) << quoted;
  auto missing = usage_error_of([&] { apply_toml_file(config, (dir / "none.toml").string()); });
  EXPECT_NE(missing.find("none.toml"), std::string::npos) << missing;
}

TEST(Config, ResumeNeedsACheckpointDirectory) {
  TrainConfig config;
  config.resume = true;
  EXPECT_THROW(validate(config), UsageError);
  config.checkpoint_dir = "/tmp/x";
  EXPECT_NO_THROW(validate(config));
}

}  // namespace afterburner::train
