#include "config_options.h"

#include <algorithm>

namespace afterburner::tools {

ConfigOptions::ConfigOptions(CLI::App* command, const train::TrainConfig& defaults,
                             const std::set<std::string>& excluded)
    : defaults_(defaults),
      given_(std::make_shared<std::map<std::string, std::string>>()),
      flag_storage_(std::make_shared<std::map<std::string, std::string>>()) {
  command->add_option("--config", config_file_, "TOML file of options (keys as the flags, with _ for -)")
      ->type_name("PATH");
  for (const auto& field : train::config_fields()) {
    if (excluded.count(field.name)) continue;
    std::string flag = field.name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    auto given = given_;
    auto name = field.name;
    if (field.is_flag) {
      // The flag's text (true, false, or --flag=VALUE) goes to the field's own parser.
      command
          ->add_flag("--" + flag + "{true},!--no-" + flag + "{false}", (*flag_storage_)[name],
                     field.help + " (default " + field.get(defaults_) + ")")
          ->each([given, name](const std::string& value) { (*given)[name] = value; });
    } else {
      command->add_option_function<std::string>(
                 "--" + flag, [given, name](const std::string& value) { (*given)[name] = value; }, field.help)
          ->type_name(field.type)
          ->default_str(field.get(defaults_));
    }
  }
}

train::TrainConfig ConfigOptions::resolve() const {
  train::TrainConfig config = defaults_;
  if (!config_file_.empty()) train::apply_toml_file(config, config_file_);
  for (const auto& [name, value] : *given_) train::set_field(config, name, value);
  train::validate(config);
  return config;
}

std::string ConfigOptions::first_given() const {
  if (!config_file_.empty()) return "--config";
  if (given_->empty()) return "";
  std::string flag = given_->begin()->first;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return "--" + flag;
}

}  // namespace afterburner::tools
