#include <fmt/format.h>
#include <torch/linalg.h>

#include <cmath>
#include <limits>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/random.h"
#include "afterburner/core/threads.h"
#include "afterburner/linalg/randomized.h"
#include "checks.h"

// LAPACK's QR with column pivoting (Fortran symbols of liblapack, column-major).
extern "C" {
void sgeqp3_(const int* m, const int* n, float* a, const int* lda, int* jpvt, float* tau, float* work,
             const int* lwork, int* info);
void dgeqp3_(const int* m, const int* n, double* a, const int* lda, int* jpvt, double* tau, double* work,
             const int* lwork, int* info);
}

namespace afterburner::linalg {
namespace {

void geqp3(int m, int n, float* a, int* jpvt, float* tau, float* work, int lwork, int* info) {
  sgeqp3_(&m, &n, a, &m, jpvt, tau, work, &lwork, info);
}
void geqp3(int m, int n, double* a, int* jpvt, double* tau, double* work, int lwork, int* info) {
  dgeqp3_(&m, &n, a, &m, jpvt, tau, work, &lwork, info);
}

// geqp3 on `column_major` ([n, d] row-major: M [d, n] column by column), in place; the pivots.
template <typename T>
std::vector<int> pivoted_qr_in_place(torch::Tensor& column_major, int d, int n) {
  std::vector<int> pivots(static_cast<size_t>(n), 0);  // 0: every column free to move
  std::vector<T> tau(static_cast<size_t>(std::min(d, n)));
  int info = 0;
  T query = 0;
  geqp3(d, n, column_major.data_ptr<T>(), pivots.data(), tau.data(), &query, -1, &info);
  std::vector<T> work(static_cast<size_t>(query));
  geqp3(d, n, column_major.data_ptr<T>(), pivots.data(), tau.data(), work.data(), static_cast<int>(work.size()),
        &info);
  if (info != 0) throw Error(fmt::format("LAPACK geqp3 failed (info {})", info));
  return pivots;
}

void require_lapack_size(int64_t size, const char* what) {
  if (size > std::numeric_limits<int>::max()) {
    throw UsageError(what, fmt::format("{} exceeds LAPACK's 32-bit sizes", size));
  }
}

}  // namespace

PivotedQR qr_column_pivoting(const torch::Tensor& M) {
  detail::require_float_matrix(M, "qr_column_pivoting M");
  const int64_t d = M.size(0), n = M.size(1);
  require_lapack_size(d * n, "qr_column_pivoting M");
  torch::Tensor column_major = M.t().contiguous();  // a copy of M's own: geqp3 overwrites it
  if (column_major.data_ptr() == M.data_ptr()) column_major = column_major.clone();
  const std::vector<int> pivots = M.scalar_type() == torch::kDouble
                                      ? pivoted_qr_in_place<double>(column_major, static_cast<int>(d), static_cast<int>(n))
                                      : pivoted_qr_in_place<float>(column_major, static_cast<int>(d), static_cast<int>(n));
  const torch::Tensor order = torch::tensor(std::vector<int64_t>(pivots.begin(), pivots.end())) - 1;  // 1-based
  return {torch::Tensor(), column_major.t().narrow(0, 0, std::min(d, n)).triu(), order};
}

PivotedQR cqrrpt(const torch::Tensor& M, double gamma, const CqrrptOptions& options) {
  const BlasThreadsGuard threads;
  detail::require_float_matrix(M, "cqrrpt M");
  const int64_t m = M.size(0), n = M.size(1);
  if (n < 1 || m < n) throw UsageError("cqrrpt M", fmt::format("expected a tall matrix (m >= n >= 1), got [{}, {}]", m, n));
  if (!(gamma >= 1.0)) throw UsageError("cqrrpt gamma", fmt::format("must be at least 1, got {}", gamma));
  const int64_t target = options.rank() ? *options.rank() : n;
  if (target < 1 || target > n) {
    throw UsageError("cqrrpt rank", fmt::format("must be between 1 and the {} columns, got {}", n, target));
  }
  // A rank-k range needs a sketch of about gamma k rows to be embedded.
  const int64_t rows = static_cast<int64_t>(std::ceil(gamma * static_cast<double>(target)));
  torch::Tensor sketched = M;  // a sketch with as many rows as M would save nothing, and could be singular
  if (rows < m) {
    sketch::SketchOptions sketch_options(options.sketch(), m, rows);
    sketch_options.nonzeros_per_column(std::min<int64_t>(4, rows)).seed(options.seed() ? *options.seed() : draw_seed());
    sketched = sketch::SketchOperator(sketch_options).apply(M.t()).t();  // S M, [rows, n]
  }
  const PivotedQR small = qr_column_pivoting(sketched);
  // The numerical rank: R's diagonal falls with the pivoting; below n eps |r_00| it is rounding.
  const torch::Tensor diagonal = small.R.diagonal().abs().narrow(0, 0, std::min(target, small.R.size(0)));
  const double epsilon = detail::machine_epsilon(M);
  const int64_t rank = std::max<int64_t>(
      1, diagonal.gt(static_cast<double>(n) * epsilon * diagonal[0].item<double>()).sum().item<int64_t>());
  const torch::Tensor leading = small.R.narrow(0, 0, rank).narrow(1, 0, rank);
  // M[:, J_k] R_11^-1 has a condition number near 1 (the sketch embeds M's range), so one
  // Cholesky QR of it is accurate.
  const torch::Tensor preconditioned = torch::linalg_solve_triangular(
      leading, M.index_select(1, small.J.narrow(0, 0, rank)), /*upper=*/true, /*left=*/false);
  const torch::Tensor cholesky = torch::linalg_cholesky(preconditioned.t().mm(preconditioned), /*upper=*/true);
  const torch::Tensor Q = torch::linalg_solve_triangular(cholesky, preconditioned, /*upper=*/true, /*left=*/false);
  if (rank == n) return {Q, cholesky.mm(small.R).triu(), small.J};
  // Rank k < n: R = [R_c R_11, Q^T M[:, J_rest]], the trailing columns projected exactly.
  const torch::Tensor rest = Q.t().mm(M.index_select(1, small.J.narrow(0, rank, n - rank)));
  return {Q, torch::cat({cholesky.mm(leading).triu(), rest}, 1), small.J};
}

}  // namespace afterburner::linalg
