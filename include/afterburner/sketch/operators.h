// Sketch operators: random linear maps S from R^n to R^m (m <= n) with E[S^T S] = I, so that
// ||S x||^2 is an unbiased estimate of ||x||^2 and S^T S x of x. Each kind applies through its
// own structure, never through the dense matrix.
//
//   namespace sketch = afterburner::sketch;
//   sketch::SketchOperator s(sketch::SketchOptions(sketch::SketchKind::srht, 8192, 256).seed(7));
//   torch::Tensor y = s.apply(x);               // x [..., 8192] -> [..., 256], each row mapped by S
//   torch::Tensor back = s.transpose_apply(y);  // [..., 256] -> [..., 8192], each row mapped by S^T
//   torch::Tensor matrix = s.dense();           // S itself, [256, 8192] float64, for checks
//
// Kinds (apply's cost per row in brackets):
//   gaussian  entries N(0, 1/m)                                               [GEMM, O(mn)]
//   sign      entries +-1/sqrt(m)                                             [GEMM, O(mn)]
//   sjlt      s nonzeros +-1/sqrt(s) per column, in distinct random rows      [scatter, O(sn)]
//   count     sjlt with s = 1: one +-1 per column in a hashed row             [scatter, O(n)]
//   srht      (1/sqrt(m)) P H D: random signs D, the Walsh-Hadamard matrix H of n zero-padded
//             to the next power of two n', m distinct rows P of the n' drawn uniformly
//                                                                             [FWHT, O(n' log n')]
// apply and transpose_apply take float32 or float64 and return that dtype. Gradients flow to the
// input through every kind (the backward of apply is transpose_apply and vice versa). gaussian and
// sign keep S in float64 and float32 (12 mn bytes); the others O(sn) or O(n + m).
#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace afterburner::sketch {

enum class SketchKind { gaussian, sign, sjlt, count, srht };

// "gaussian", "sign", "sjlt", "count" or "srht"; anything else is a UsageError.
SketchKind parse_sketch_kind(const std::string& name);
std::string to_string(SketchKind kind);

struct SketchOptions {
  SketchOptions(SketchKind kind, int64_t input_dim, int64_t sketch_dim)
      : kind_(kind), input_dim_(input_dim), sketch_dim_(sketch_dim) {}
  TORCH_ARG(SketchKind, kind);
  TORCH_ARG(int64_t, input_dim);   // n
  TORCH_ARG(int64_t, sketch_dim);  // m, at most n
  TORCH_ARG(int64_t, nonzeros_per_column) = 4;  // s, sjlt only: between 1 and m
  // The same seed gives the same operator. Unset: drawn from torch's default generator, so
  // torch::manual_seed reproduces it; SketchOperator::options().seed() then holds the drawn seed.
  TORCH_ARG(c10::optional<uint64_t>, seed) = c10::nullopt;
};

class SketchOperator {
 public:
  // Draws the operator. Throws UsageError naming the option for sizes out of range.
  explicit SketchOperator(const SketchOptions& options);

  // S applied to each row: x [..., n] -> [..., m] (y = x S^T).
  torch::Tensor apply(const torch::Tensor& x) const;
  // S^T applied to each row: y [..., m] -> [..., n] (x = y S).
  torch::Tensor transpose_apply(const torch::Tensor& y) const;
  // S as a [m, n] float64 matrix, built entry by entry from the operator's definition.
  torch::Tensor dense() const;

  // The options with the seed filled in.
  const SketchOptions& options() const { return options_; }

 private:
  torch::Tensor map(const torch::Tensor& input, bool transpose) const;  // S x, or S^T y when transpose

  SketchOptions options_;
  // gaussian and sign: S in float64 and a float32 copy for float32 input.
  torch::Tensor matrix_, matrix_float_;
  // sjlt and count: rows_ [n, s] (int64) holds the rows of column j's nonzeros, signs_ [n, s]
  // (int8) their signs. srht: signs_ [n] is D, rows_ [m] the rows of H that P keeps.
  torch::Tensor rows_, signs_;
};

// The Walsh-Hadamard transform in place, unnormalised: each row x of a contiguous float32 or
// float64 tensor whose last dimension n is a power of two becomes H x, with H the Sylvester
// Hadamard matrix (H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]]; H H^T = n I). Not differentiable:
// throws UsageError for a tensor requiring grad while grad mode is on. Bumps the tensor's version,
// as LibTorch's in-place ops do, so a backward that saved it refuses to run.
void walsh_hadamard_(torch::Tensor& rows);

}  // namespace afterburner::sketch
