// Internal to the sketch area: what every sketched layer draws and checks the same way.
#pragma once

#include <c10/util/StringUtil.h>
#include <fmt/format.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "afterburner/core/error.h"

namespace afterburner::sketch::detail {

// Independent k-row sign matrices scaled to unit expected column norm: +-1/sqrt(k), so that
// E[U^T U] = I and every sketched term is an unbiased estimate of the dense one.
inline torch::Tensor scaled_signs(std::vector<int64_t> shape, int64_t rank) {
  return (torch::randint(0, 2, shape, torch::kFloat) * 2 - 1) / std::sqrt(static_cast<double>(rank));
}

// A tensor's sizes as error messages print them: [2, 3].
inline std::string shape(const torch::Tensor& tensor) { return c10::str(tensor.sizes()); }

// Throws UsageError("<layer> <field>", ...) for the first field below `minimum`.
inline void require_at_least(const std::string& layer, int64_t minimum,
                             std::initializer_list<std::pair<const char*, int64_t>> fields) {
  for (const auto& [name, value] : fields) {
    if (value < minimum) {
      throw UsageError(layer + " " + name, fmt::format("must be at least {}, got {}", minimum, value));
    }
  }
}

// The dense weight a layer is initialised from must have the dense layer's own layout.
inline void require_dense_layout(const std::string& layer, const torch::Tensor& dense_weight,
                                 torch::IntArrayRef expected, const std::string& layout) {
  if (dense_weight.defined() && dense_weight.sizes() != expected) {
    throw UsageError(layer + " dense_weight", fmt::format("expected {} ({}'s layout), got {}", c10::str(expected),
                                                          layout, c10::str(dense_weight.sizes())));
  }
}

// One line on stderr, "afterburner: <layer> <cost compared>: no saving", once per process for
// each distinct line: a statistical test building thousands of such layers says it once.
inline void warn_saves_nothing(const std::string& layer, const std::string& cost_compared) {
  static std::mutex mutex;
  static std::set<std::string> said;
  const std::string line = fmt::format("afterburner: {} {}: no saving\n", layer, cost_compared);
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(line).second) std::cerr << line;
}

}  // namespace afterburner::sketch::detail
