// Internal to the linalg area: orthonormal bases of tall matrices.
#pragma once

#include <torch/linalg.h>
#include <torch/types.h>

#include <optional>

#include "checks.h"

namespace afterburner::linalg::detail {

// Y R^-1 with R^T R = Y^T Y (Cholesky QR), or nothing where the Gram matrix is not numerically
// positive definite (Y's condition number beyond about eps^-1/2).
inline std::optional<torch::Tensor> cholesky_qr(const torch::Tensor& Y) {
  const auto [R, info] = torch::linalg_cholesky_ex(Y.t().mm(Y), /*upper=*/true);
  if (info.item<int64_t>() != 0) return std::nullopt;
  return torch::linalg_solve_triangular(R, Y, /*upper=*/true, /*left=*/false);
}

// An orthonormal basis of Y's columns. Cholesky QR twice (the second pass makes the first's
// columns orthonormal to rounding: two small GEMMs and two triangular solves, where LAPACK's
// Householder QR of a tall-skinny Y runs mostly matrix-vector products, 8x slower at 4096 x 64),
// checked; Householder's QR where Y is too ill-conditioned for it.
inline torch::Tensor orthonormal_basis(const torch::Tensor& Y) {
  if (const auto first = cholesky_qr(Y)) {
    if (const auto second = cholesky_qr(*first)) {
      const double epsilon = machine_epsilon(Y);
      const torch::Tensor gram = second->t().mm(*second);
      const double departure = (gram - torch::eye(gram.size(0), gram.options())).abs().max().item<double>();
      if (departure <= 1e3 * epsilon) return *second;
    }
  }
  return std::get<0>(torch::linalg_qr(Y));
}

}  // namespace afterburner::linalg::detail
