// Randomized factorizations (RandLAPACK's, as Panther offers them): a truncated SVD from a blocked
// randomized range finder, and CQRRPT, a column-pivoted QR of a tall matrix from a sketch.
//
//   namespace linalg = afterburner::linalg;
//   linalg::TruncatedSVD svd = linalg::randomized_svd(A, 64);        // A [m, n] ~ U diag(S) V^T
//   linalg::PivotedQR qr = linalg::cqrrpt(M);                         // M[:, J] = Q R, M [m, n], m >= n
//   linalg::PivotedQR low = linalg::cqrrpt(M, 1.25, linalg::CqrrptOptions().rank(64));  // ~ rank 64
//
// float32 and float64, CPU; the dense factorizations of the small matrices are LAPACK's (geqp3
// for the pivoting, through LibTorch for QR, SVD and Cholesky).
#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>

#include "afterburner/sketch/operators.h"

namespace afterburner::linalg {

struct TruncatedSVD {
  torch::Tensor U, S, V;  // [m, r], [r] (descending), [n, r]: A ~ U diag(S) V^T, r <= k
};

struct RandomizedSVDOptions {
  // Columns drawn per block of the range finder: blocks are added until the rank reaches
  // k + oversampling or ||A - Q Q^T A||_F falls below tol ||A||_F.
  TORCH_ARG(int64_t, block_size) = 64;
  TORCH_ARG(int64_t, oversampling) = 10;
  // Each block's subspace iterations (Y <- A (A^T Y), re-orthonormalised between products): two
  // make the leading singular directions accurate where the spectrum decays slowly.
  TORCH_ARG(int64_t, power_iterations) = 2;
  // The Gaussian test matrices' seed. Unset: drawn from torch's default generator (never reseeded).
  TORCH_ARG(c10::optional<uint64_t>, seed) = c10::nullopt;
};

// The leading k singular triplets of A [m, n]: QB (Q orthonormal [m, l], B = Q^T A) grown block
// by block, each block's range found by a Gaussian sketch with power iterations and made
// orthogonal to the earlier blocks (twice, to hold orthogonality in floating point), stopped at
// rank k + oversampling or once ||A - Q B||_F <= tol ||A||_F (tol = 0: never early); then the SVD
// of the small B, truncated to k (or to the rank at which the tolerance held). Throws UsageError
// for a matrix that is not 2-D float32/float64, k outside [1, min(m, n)], or tol < 0.
TruncatedSVD randomized_svd(const torch::Tensor& A, int64_t k, double tol = 0.0,
                            const RandomizedSVDOptions& options = {});

struct PivotedQR {
  // M[:, J] = Q R (or its rank-k approximation): Q [m, k] orthonormal columns, R [k, n] upper
  // triangular (trapezoidal for k < n), J [n] int64 the column order (0-based).
  torch::Tensor Q, R, J;
};

struct CqrrptOptions {
  // The sketch S [ceil(gamma k), m]: SJLT (sparse, 4 nonzeros per column, RandLAPACK's default)
  // or any kind of sketch::SketchKind.
  TORCH_ARG(sketch::SketchKind, sketch) = sketch::SketchKind::sjlt;
  // The largest rank k wanted; unset: n, a whole QR. Below n, the rank-k approximation
  // M[:, J] ~ Q R, from a sketch of only ceil(gamma k) rows.
  TORCH_ARG(c10::optional<int64_t>, rank) = c10::nullopt;
  TORCH_ARG(c10::optional<uint64_t>, seed) = c10::nullopt;
};

// CQRRPT (Melnichenko, Balabanov, Murray, Demmel, Mahoney, Luszczek): the column-pivoted QR of the
// sketch S M gives the pivots J and R_sk; M[:, J_k] R_11^-1 is then well conditioned, and one
// Cholesky QR of it (R_c^T R_c = its Gram matrix) finishes: Q = M[:, J_k] R_11^-1 R_c^-1,
// R = R_c R_sk. k is the sketch's numerical rank (|r_kk| above n eps |r_00|), at most the rank
// asked for: a rank-deficient M gives its rank and M[:, J] = Q R still. Where ceil(gamma k) >= m
// the sketch would save nothing, and M itself is pivoted. Throws UsageError for a matrix that is
// not 2-D float32/float64 with m >= n >= 1, gamma < 1, or a rank outside [1, n].
PivotedQR cqrrpt(const torch::Tensor& M, double gamma = 1.25, const CqrrptOptions& options = {});

// LAPACK's geqp3 on M [d, n] (float32/float64): the column order J and the upper-triangular R
// [min(d, n), n] of M[:, J] = Q R (Q not formed).
PivotedQR qr_column_pivoting(const torch::Tensor& M);

}  // namespace afterburner::linalg
