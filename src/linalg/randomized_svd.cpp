#include <fmt/format.h>
#include <torch/linalg.h>

#include <algorithm>
#include <cmath>

#include "afterburner/core/error.h"
#include "afterburner/core/random.h"
#include "afterburner/core/threads.h"
#include "afterburner/linalg/randomized.h"
#include "checks.h"
#include "orthonormal.h"

namespace afterburner::linalg {
namespace {

using detail::orthonormal_basis;

// An orthonormal basis of Y's columns with Q's span removed: classical Gram-Schmidt against Q
// twice ("twice is enough": one pass leaves errors of eps times Y's condition number).
torch::Tensor orthogonal_to(torch::Tensor Y, const torch::Tensor& Q) {
  if (Q.defined()) {
    for (int pass = 0; pass < 2; ++pass) Y = Y - Q.mm(Q.t().mm(Y));
  }
  torch::Tensor basis = orthonormal_basis(Y);
  if (Q.defined()) basis = orthonormal_basis(basis - Q.mm(Q.t().mm(basis)));
  return basis;
}

}  // namespace

TruncatedSVD randomized_svd(const torch::Tensor& A, int64_t k, double tol, const RandomizedSVDOptions& options) {
  const BlasThreadsGuard threads;
  detail::require_float_matrix(A, "randomized_svd A");
  const int64_t m = A.size(0), n = A.size(1);
  if (k < 1 || k > std::min(m, n)) {
    throw UsageError("randomized_svd k", fmt::format("must be between 1 and min(m, n) = {}, got {}", std::min(m, n), k));
  }
  if (!(tol >= 0)) throw UsageError("randomized_svd tol", fmt::format("must be 0 or more, got {}", tol));
  if (options.block_size() < 1 || options.oversampling() < 0 || options.power_iterations() < 0) {
    throw UsageError("randomized_svd options", "block_size must be at least 1, oversampling and power_iterations 0 "
                                               "or more");
  }
  at::Generator generator = seeded_generator(options.seed() ? *options.seed() : draw_seed());
  const int64_t target = std::min(k + options.oversampling(), std::min(m, n));
  const double total = A.square().sum().item<double>();
  const double epsilon = detail::machine_epsilon(A);
  torch::Tensor Q, B;
  double captured = 0;
  while (!Q.defined() || Q.size(1) < target) {
    const int64_t columns = std::min(options.block_size(), target - (Q.defined() ? Q.size(1) : 0));
    torch::Tensor Y = A.mm(torch::randn({n, columns}, generator, A.options()));
    for (int64_t i = 0; i < options.power_iterations(); ++i) {
      Y = A.mm(orthonormal_basis(A.t().mm(orthonormal_basis(Y))));
    }
    const torch::Tensor block = orthogonal_to(Y, Q);
    const torch::Tensor projected = block.t().mm(A);  // this block's rows of B = Q^T A
    Q = Q.defined() ? torch::cat({Q, block}, 1) : block;
    B = B.defined() ? torch::cat({B, projected}, 0) : projected;
    // ||A - Q B||_F^2 = ||A||_F^2 - ||B||_F^2 for orthonormal Q, which rounding resolves down to
    // about 100 eps ||A||_F^2; below that the residual is measured instead.
    captured += projected.square().sum().item<double>();
    if (tol > 0 && total - captured <= std::max(tol * tol, 100 * epsilon) * total &&
        (tol * tol >= 100 * epsilon || (A - Q.mm(B)).norm().item<double>() <= tol * std::sqrt(total))) {
      break;
    }
  }
  const auto [small_u, S, Vh] = torch::linalg_svd(B, /*full_matrices=*/false);
  const int64_t rank = std::min(k, S.size(0));
  return {Q.mm(small_u.narrow(1, 0, rank)), S.narrow(0, 0, rank).clone(), Vh.narrow(0, 0, rank).t().contiguous()};
}

}  // namespace afterburner::linalg
