// The randomized factorizations as dispatcher ops, for the Python package's afterburner.linalg and
// for TorchScript. Not differentiable: their results are factorizations, not functions of A
// whose gradient users expect (as Panther's).
#include <torch/library.h>

#include <tuple>

#include "afterburner/linalg/randomized.h"

namespace afterburner::linalg {
namespace {

c10::optional<uint64_t> seed_of(const c10::optional<int64_t>& seed) {
  return seed ? c10::optional<uint64_t>(static_cast<uint64_t>(*seed)) : c10::nullopt;
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> randomized_svd_op(const torch::Tensor& A, int64_t k,
                                                                          double tol, int64_t block_size,
                                                                          int64_t oversampling,
                                                                          int64_t power_iterations,
                                                                          c10::optional<int64_t> seed) {
  const TruncatedSVD svd = randomized_svd(A, k, tol,
                                          RandomizedSVDOptions()
                                              .block_size(block_size)
                                              .oversampling(oversampling)
                                              .power_iterations(power_iterations)
                                              .seed(seed_of(seed)));
  return {svd.U, svd.S, svd.V};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> cqrrpt_op(const torch::Tensor& M, double gamma,
                                                                  c10::string_view sketch, c10::optional<int64_t> rank,
                                                                  c10::optional<int64_t> seed) {
  const PivotedQR qr = cqrrpt(
      M, gamma,
      CqrrptOptions().sketch(sketch::parse_sketch_kind(std::string(sketch))).rank(rank).seed(seed_of(seed)));
  return {qr.Q, qr.R, qr.J};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(afterburner, m) {
  // U [m, r], S [r], V [n, r] with A ~ U diag(S) V^T, r <= k: a blocked randomized range finder
  // with power iterations, stopped at rank k + oversampling or ||A - Q Q^T A||_F <= tol ||A||_F.
  m.def("randomized_svd(Tensor A, int k, float tol=0.0, int block_size=64, int oversampling=10, "
        "int power_iterations=2, int? seed=None) -> (Tensor, Tensor, Tensor)",
        randomized_svd_op);
  // Q [m, k], R [k, n], J [n] with M[:, J] = Q R (k the numerical rank, at most `rank`; below n an
  // approximation): CQRRPT (pivots from the QR of a sketch S M with ceil(gamma k) rows, then one
  // preconditioned Cholesky QR).
  m.def("cqrrpt(Tensor M, float gamma=1.25, str sketch='sjlt', int? rank=None, int? seed=None) -> "
        "(Tensor, Tensor, Tensor)",
        cqrrpt_op);
}

}  // namespace afterburner::linalg
