#include "afterburner/kernels/gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

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

// Whether oneDNN can compute a [M, K] times b [K, N] (operands it cannot read in place, such as
// a sum's expanded gradient, as contiguous copies); anything else (and every error message) is
// at::mm's.
bool onednn_suits(const torch::Tensor& a, const torch::Tensor& b) {
  return fp32_matrix(a) && fp32_matrix(b) && a.size(1) == b.size(0) && a.numel() > 0 && b.numel() > 0;
}

// c [M, N] (rows contiguous, c.stride(0) apart) = a b + beta c.
void onednn_gemm(const torch::Tensor& a, const torch::Tensor& b, float beta, torch::Tensor& c) {
  // A copy with the strides of a fresh tensor: contiguous() hands back a [1, 1] view of any strides.
  auto readable = [](const torch::Tensor& t) { return as_operand(t) ? t : t.clone(at::MemoryFormat::Contiguous); };
  const torch::Tensor a_read = readable(a), b_read = readable(b);
  const Operand lhs = *as_operand(a_read), rhs = *as_operand(b_read);
  const dnnl_status_t status =
      dnnl_sgemm(lhs.transpose, rhs.transpose, a.size(0), b.size(1), a.size(1), 1.0f, lhs.data, lhs.leading_dimension,
                 rhs.data, rhs.leading_dimension, beta, c.data_ptr<float>(), c.stride(0));
  if (status != dnnl_success) throw Error("oneDNN sgemm failed with status " + std::to_string(status));
}

// oneDNN's result is written through data_ptr and records nothing for autograd: where autograd
// records a graph (a direct call on tensors requiring grad, or a fused op's backward under
// create_graph), LibTorch's op runs instead, so that no gradient is silently lost.
bool autograd_records(std::initializer_list<torch::Tensor> operands) {
  if (!at::GradMode::is_enabled()) return false;
  return std::any_of(operands.begin(), operands.end(), [](const torch::Tensor& t) { return t.requires_grad(); });
}

std::optional<dnnl::memory::data_type> onednn_type(at::ScalarType type) {
  if (type == at::kFloat) return dnnl::memory::data_type::f32;
  if (type == at::kBFloat16) return dnnl::memory::data_type::bf16;
  return std::nullopt;
}

// A strided 2-D tensor as oneDNN describes it (any strides: transposes and row slices included).
dnnl::memory::desc matrix_desc(const torch::Tensor& t, dnnl::memory::data_type type) {
  return dnnl::memory::desc({t.size(0), t.size(1)}, type, {t.stride(0), t.stride(1)});
}

bool matmul_suits(const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b) {
  const auto strided_cpu = [&](const torch::Tensor& t) {
    const bool no_broadcast = std::all_of(t.strides().begin(), t.strides().end(), [](int64_t s) { return s > 0; });
    return t.device().is_cpu() && t.layout() == torch::kStrided && !t.is_conj() && !t.is_neg() &&
           t.scalar_type() == a.scalar_type() && no_broadcast;
  };
  return onednn_type(a.scalar_type()) && a.dim() == 2 && b.dim() == 2 && bias.dim() == 1 && strided_cpu(a) &&
         strided_cpu(b) && strided_cpu(bias) && a.size(1) == b.size(0) && bias.size(0) == b.size(1) &&
         a.numel() > 0 && b.numel() > 0;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN keeps the primitives it made in its own cache (keyed by shapes, strides, types and
// attributes): making one again for the same problem finds it there.
dnnl::matmul matmul_primitive(const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                              const dnnl::memory::desc& bias, const dnnl::memory::desc& c, Epilogue epilogue) {
  dnnl::post_ops post_ops;
  if (epilogue == Epilogue::gelu) post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
  dnnl::primitive_attr attributes;
  attributes.set_post_ops(post_ops);
  return dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), attributes, cpu_engine()));
}

}  // namespace

torch::Tensor mm(const torch::Tensor& a, const torch::Tensor& b) {
  if (!onednn_suits(a, b) || autograd_records({a, b})) return at::mm(a, b);
  torch::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
  onednn_gemm(a, b, 0.0f, c);
  return c;
}

torch::Tensor bmm(const torch::Tensor& a, const torch::Tensor& b) {
  const bool batches_suit = a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(0) > 0;
  if (!batches_suit || !onednn_suits(a[0], b[0]) || autograd_records({a, b})) return at::bmm(a, b);
  // One oneDNN matmul over the whole batch (a GEMM per matrix through LibTorch's views cost more
  // than the products themselves for many small matrices: a transformer's heads at short
  // sequences). Its descriptors take any strides but 0 (an expanded operand is copied).
  auto readable = [](const torch::Tensor& t) {
    const bool expanded = std::any_of(t.strides().begin(), t.strides().end(), [](int64_t s) { return s == 0; });
    return expanded ? t.contiguous() : t;
  };
  const torch::Tensor a_read = readable(a), b_read = readable(b);
  torch::Tensor c = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  const auto desc = [](const torch::Tensor& t) {
    return dnnl::memory::desc({t.size(0), t.size(1), t.size(2)}, dnnl::memory::data_type::f32,
                              {t.stride(0), t.stride(1), t.stride(2)});
  };
  const dnnl::memory::desc a_desc = desc(a_read), b_desc = desc(b_read), c_desc = desc(c);
  const auto memory = [&](const dnnl::memory::desc& d, const torch::Tensor& t) {
    return dnnl::memory(d, cpu_engine(), t.data_ptr());  // oneDNN reads inputs only
  };
  dnnl::stream stream(cpu_engine());
  matmul_primitive(a_desc, b_desc, dnnl::memory::desc(), c_desc, Epilogue::identity)
      .execute(stream, {{DNNL_ARG_SRC, memory(a_desc, a_read)},
                        {DNNL_ARG_WEIGHTS, memory(b_desc, b_read)},
                        {DNNL_ARG_DST, memory(c_desc, c)}});
  stream.wait();
  return c;
}

void mm_into(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b, float beta) {
  const bool rows_contiguous = c.dim() == 2 && c.stride(1) == 1 && c.stride(0) >= std::max<int64_t>(c.size(1), 1);
  if (!onednn_suits(a, b) || !rows_contiguous || c.scalar_type() != torch::kFloat || autograd_records({a, b, c})) {
    if (beta == 0.0f) {
      at::mm_out(c, a, b);
    } else {
      c.mul_(beta).addmm_(a, b);
    }
    return;
  }
  onednn_gemm(a, b, beta, c);
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

torch::Tensor addmm_fused(const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b,
                          Epilogue epilogue) {
  if (!matmul_suits(bias, a, b) || autograd_records({bias, a, b})) {
    const torch::Tensor product = at::addmm(bias, a, b);
    switch (epilogue) {
      case Epilogue::gelu: return at::gelu(product);
      case Epilogue::relu: return at::relu(product);
      case Epilogue::identity: break;
    }
    return product;
  }
  const dnnl::memory::data_type type = *onednn_type(a.scalar_type());
  torch::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
  const dnnl::memory::desc a_desc = matrix_desc(a, type), b_desc = matrix_desc(b, type), c_desc = matrix_desc(c, type);
  const torch::Tensor bias_row = bias.contiguous().unsqueeze(0);  // oneDNN reads the bias densely, whatever its strides
  const dnnl::memory::desc bias_desc = matrix_desc(bias_row, type);
  const auto memory = [&](const dnnl::memory::desc& desc, const torch::Tensor& t) {
    return dnnl::memory(desc, cpu_engine(), t.data_ptr());  // oneDNN reads inputs only: no write through it
  };
  dnnl::stream stream(cpu_engine());
  matmul_primitive(a_desc, b_desc, bias_desc, c_desc, epilogue)
      .execute(stream, {{DNNL_ARG_SRC, memory(a_desc, a)},
                        {DNNL_ARG_WEIGHTS, memory(b_desc, b)},
                        {DNNL_ARG_BIAS, memory(bias_desc, bias_row)},
                        {DNNL_ARG_DST, memory(c_desc, c)}});
  stream.wait();
  // oneDNN's relu post-op makes NaN 0; LibTorch's keeps it: relu runs as LibTorch's, in place on
  // the fresh output.
  return epilogue == Epilogue::relu ? c.relu_() : c;
}

}  // namespace afterburner::kernels
