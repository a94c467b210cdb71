// Option helpers the subcommands share, so that their --help and their errors read alike.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace afterburner::tools {

// A number check that says its bound in words and refuses NaN and infinity. CLI11's
// PositiveNumber and NonNegativeNumber print their bounds with std::to_string: a 309-digit
// DBL_MAX ("Value 0 not in range 0.000000 to 179769313486231570814527423731704...").
inline CLI::Validator number_check(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& text) {
        double value = 0;
        const bool number = CLI::detail::lexical_cast(text, value) && std::isfinite(value);
        if (number && (value > 0 || (zero_allowed && value == 0))) return std::string();
        return fmt::format("must be a {} number, got '{}'", zero_allowed ? "non-negative" : "positive", text);
      },
      zero_allowed ? "NONNEGATIVE" : "POSITIVE");
}
inline const CLI::Validator kPositive = number_check(false);
inline const CLI::Validator kNonNegative = number_check(true);

// A comma-separated list of positive integers in one argument (--ranks 8,16,32), shown in --help
// as it is given: "INT,...=8,16,32".
template <typename Integer>
CLI::Option* add_list_option(CLI::App* app, const std::string& name, std::vector<Integer>& values,
                             const std::string& help) {
  return app
      ->add_option_function<std::string>(
          name,
          [name, &values](const std::string& text) {
            std::vector<Integer> parsed;
            std::stringstream items(text);
            for (std::string item; std::getline(items, item, ',');) {
              Integer value = 0;
              if (!CLI::detail::lexical_cast(item, value) || value <= 0) {
                throw CLI::ValidationError(name, fmt::format("expected positive integers separated by commas, got '{}'", text));
              }
              parsed.push_back(value);
            }
            if (parsed.empty()) throw CLI::ValidationError(name, "expected at least one integer");
            values = parsed;
          },
          help + " (comma-separated)")
      ->type_name("INT,...")
      ->default_str(fmt::format("{}", fmt::join(values, ",")));
}

}  // namespace afterburner::tools
