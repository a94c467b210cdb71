#include "afterburner/kernels/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>

#include "afterburner/core/error.h"

namespace afterburner::kernels {
namespace {

// A row-major GEMM operand as oneDNN takes it: a matrix or the transpose of one, with its
// leading dimension.
struct Operand {
  char transpose;
  dnnl_dim_t leading_dimension;
  const float* data;
};

std::optional<Operand> as_operand(const torch::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  if (t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(cols, 1)) return Operand{'N', t.stride(0), t.data_ptr<float>()};
  if (t.stride(0) == 1 && t.stride(1) >= std::max<int64_t>(rows, 1)) return Operand{'T', t.stride(1), t.data_ptr<float>()};
  return std::nullopt;
}

bool fp32_matrix(const torch::Tensor& t) {
  return t.dim() == 2 && t.scalar_type() == torch::kFloat && t.device().is_cpu() && t.layout() == torch::kStrided &&
         !t.is_conj() && !t.is_neg();
}

// Whether oneDNN can compute a [M, K] times b [K, N]; anything else (and every error message)
// is at::mm's.
bool onednn_suits(const torch::Tensor& a, const torch::Tensor& b) {
  return fp32_matrix(a) && fp32_matrix(b) && a.size(1) == b.size(0) && a.numel() > 0 && b.numel() > 0 &&
         as_operand(a) && as_operand(b);
}

// c [M, N] (contiguous) = a b + beta c.
void onednn_gemm(const torch::Tensor& a, const torch::Tensor& b, float beta, torch::Tensor& c) {
  const Operand lhs = *as_operand(a), rhs = *as_operand(b);
  const dnnl_status_t status =
      dnnl_sgemm(lhs.transpose, rhs.transpose, a.size(0), b.size(1), a.size(1), 1.0f, lhs.data, lhs.leading_dimension,
                 rhs.data, rhs.leading_dimension, beta, c.data_ptr<float>(), c.size(1));
  if (status != dnnl_success) throw Error("oneDNN sgemm failed with status " + std::to_string(status));
}

// oneDNN's result is written through data_ptr and records nothing for autograd: where autograd
// records a graph (a direct call on tensors requiring grad, or a fused op's backward under
// create_graph), LibTorch's op runs instead, so that no gradient is silently lost.
bool autograd_records(std::initializer_list<torch::Tensor> operands) {
  if (!at::GradMode::is_enabled()) return false;
  return std::any_of(operands.begin(), operands.end(), [](const torch::Tensor& t) { return t.requires_grad(); });
}

}  // namespace

torch::Tensor mm(const torch::Tensor& a, const torch::Tensor& b) {
  if (!onednn_suits(a, b) || autograd_records({a, b})) return at::mm(a, b);
  torch::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
  onednn_gemm(a, b, 0.0f, c);
  return c;
}

torch::Tensor addmm(const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b) {
  const bool bias_suits = bias.dim() == 1 && bias.scalar_type() == torch::kFloat && bias.device().is_cpu();
  if (!bias_suits || !onednn_suits(a, b) || bias.size(0) != b.size(1) || autograd_records({bias, a, b})) {
    return at::addmm(bias, a, b);
  }
  // A fresh output: `bias.expand(...).contiguous()` would hand back the bias's own storage when
  // there is one row (a size-1 leading dimension is already contiguous), and the GEMM would then
  // accumulate into the bias.
  torch::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
  c.copy_(bias.expand({a.size(0), b.size(1)}));
  onednn_gemm(a, b, 1.0f, c);
  return c;
}

}  // namespace afterburner::kernels
