// Internal to the linalg area: the argument checks its functions share.
#pragma once

#include <c10/util/StringUtil.h>
#include <torch/types.h>

#include <limits>
#include <string>

#include "afterburner/core/error.h"

namespace afterburner::linalg::detail {

// Throws UsageError(name, ...) unless `matrix` is a 2-D float32 or float64 CPU tensor.
inline void require_float_matrix(const torch::Tensor& matrix, const std::string& name) {
  if (!matrix.defined() || matrix.dim() != 2 || !matrix.device().is_cpu() ||
      (matrix.scalar_type() != torch::kFloat && matrix.scalar_type() != torch::kDouble)) {
    throw UsageError(name, matrix.defined() ? "expected a 2-D float32 or float64 CPU matrix, got " +
                                                  std::string(c10::toString(matrix.scalar_type())) + " " +
                                                  c10::str(matrix.sizes())
                                            : "expected a matrix, got none");
  }
}

// The unit roundoff of a float32 or float64 matrix's dtype.
inline double machine_epsilon(const torch::Tensor& matrix) {
  return matrix.scalar_type() == torch::kFloat ? std::numeric_limits<float>::epsilon()
                                               : std::numeric_limits<double>::epsilon();
}

}  // namespace afterburner::linalg::detail
