// Option helpers the subcommands share, so that their --help and their errors read alike.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <string>

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

}  // namespace afterburner::tools
