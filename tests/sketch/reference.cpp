#include "reference.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

namespace afterburner::sketch::reference {

torch::Tensor sklinear(const torch::Tensor& x, const torch::Tensor& s1, const torch::Tensor& s2,
                       const torch::Tensor& u1, const torch::Tensor& u2, const torch::Tensor& bias) {
  const int64_t terms = s1.size(0);
  torch::Tensor sum = torch::zeros({x.size(0), s2.size(2)}, x.options());
  for (int64_t i = 0; i < terms; ++i) sum = sum + x.mm(s1[i]).mm(u1[i]) + x.mm(u2[i]).mm(s2[i]);
  sum = sum / (2.0 * static_cast<double>(terms));
  return bias.defined() ? sum + bias : sum;
}

torch::Tensor skconv2d(const torch::Tensor& x, const torch::Tensor& s1, const torch::Tensor& u1,
                       const torch::Tensor& bias, torch::IntArrayRef stride, torch::IntArrayRef padding) {
  const int64_t sketches = u1.size(0), rank = u1.size(1), out = u1.size(2);  // sketches = 2L
  torch::Tensor sum;
  for (int64_t i = 0; i < sketches; ++i) {
    for (int64_t kappa = 0; kappa < rank; ++kappa) {
      const torch::Tensor channel = torch::conv2d(x, s1[i * rank + kappa].unsqueeze(0), {}, stride, padding);
      const torch::Tensor term = channel * u1[i][kappa].view({1, out, 1, 1});
      sum = sum.defined() ? sum + term : term;
    }
  }
  sum = sum / static_cast<double>(sketches);
  return bias.defined() ? sum + bias.view({1, out, 1, 1}) : sum;
}

namespace {

torch::Tensor projected(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                        int64_t heads) {
  const torch::Tensor y = torch::nn::functional::linear(x, weight, bias);
  return y.view({x.size(0), x.size(1), heads, y.size(2) / heads});  // [B, L, H, d]
}

torch::Tensor features(const torch::Tensor& x, const torch::Tensor& projection, bool softmax, bool is_query) {
  const double m = static_cast<double>(projection.size(0));
  if (!softmax) return torch::relu(1.0 / std::sqrt(m) * torch::matmul(x, projection.t())) + 1e-5;
  const torch::Tensor scaled = x * (1.0 / std::sqrt(std::sqrt(static_cast<double>(x.size(-1)))));
  const torch::Tensor dash = torch::matmul(scaled, projection.t());
  const torch::Tensor diag = scaled.pow(2).sum(-1).div(2.0).unsqueeze(-1);
  torch::Tensor max = std::get<0>(dash.max(-1, /*keepdim=*/true));
  if (!is_query) max = std::get<0>(max.max(-3, /*keepdim=*/true));
  return 1.0 / std::sqrt(m) * (torch::exp(dash - diag - max) + 1e-5);
}

}  // namespace

torch::Tensor rand_mha(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                       const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
                       const torch::Tensor& W0, const torch::Tensor& bq, const torch::Tensor& bk,
                       const torch::Tensor& bv, const torch::Tensor& b0, const torch::Tensor& projection,
                       int64_t heads, bool softmax, bool causal, const torch::Tensor& keep_queries,
                       const torch::Tensor& keep_keys, const torch::Tensor& key_factors) {
  torch::Tensor qf = features(projected(query, Wq, bq, heads), projection, softmax, true);  // [B, L, H, m]
  torch::Tensor kf = features(projected(key, Wk, bk, heads), projection, softmax, false);   // [B, S, H, m]
  torch::Tensor v = projected(value, Wv, bv, heads);                                         // [B, S, H, d]
  const bool masked = keep_queries.defined() || keep_keys.defined();
  if (keep_queries.defined()) qf = qf.masked_fill(keep_queries.logical_not().view({qf.size(0), qf.size(1), 1, 1}), 0);
  if (keep_keys.defined()) kf = kf.masked_fill(keep_keys.logical_not().view({kf.size(0), kf.size(1), 1, 1}), 0);
  const torch::Tensor vn = key_factors.defined() ? v * key_factors.unsqueeze(-1) : v;
  torch::Tensor numerator, normaliser;
  if (!causal) {
    const torch::Tensor kvs = torch::matmul(kf.permute({0, 2, 3, 1}), vn.permute({0, 2, 1, 3}));  // [B, H, m, d]
    numerator = torch::matmul(qf.permute({0, 2, 1, 3}), kvs).transpose(1, 2);                  // [B, L, H, d]
    normaliser = (qf.transpose(0, 1) * kf.sum(1)).sum(-1).transpose(0, 1);                     // [B, L, H]
  } else {
    torch::Tensor sums = torch::zeros({qf.size(0), qf.size(2), qf.size(3), v.size(3)}, qf.options());
    torch::Tensor key_sums = torch::zeros({qf.size(0), qf.size(2), qf.size(3)}, qf.options());
    std::vector<torch::Tensor> rows, norms;
    for (int64_t i = 0; i < qf.size(1); ++i) {
      sums = sums + torch::einsum("bhm,bhd->bhmd", {kf.select(1, i), vn.select(1, i)});
      key_sums = key_sums + kf.select(1, i);
      rows.push_back(torch::einsum("bhmd,bhm->bhd", {sums, qf.select(1, i)}));
      norms.push_back((qf.select(1, i) * key_sums).sum(-1));
    }
    numerator = torch::stack(rows, 1);
    normaliser = torch::stack(norms, 1);
  }
  if (masked) normaliser = normaliser.masked_fill(normaliser == 0, 1.0);
  const torch::Tensor attended = numerator / normaliser.unsqueeze(-1);
  return torch::nn::functional::linear(attended.reshape({query.size(0), query.size(1), -1}), W0, b0);
}

torch::Tensor exact_mha(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                        const torch::Tensor& Wq, const torch::Tensor& Wk, const torch::Tensor& Wv,
                        const torch::Tensor& W0, const torch::Tensor& bq, const torch::Tensor& bk,
                        const torch::Tensor& bv, const torch::Tensor& b0, int64_t heads, bool causal) {
  const torch::Tensor q = projected(query, Wq, bq, heads).transpose(1, 2);  // [B, H, L, d]
  const torch::Tensor k = projected(key, Wk, bk, heads).transpose(1, 2);
  const torch::Tensor v = projected(value, Wv, bv, heads).transpose(1, 2);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (causal) {
    const torch::Tensor future = torch::ones({q.size(2), k.size(2)}, torch::kBool).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  const torch::Tensor attended = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2);
  return torch::nn::functional::linear(attended.reshape({query.size(0), query.size(1), -1}), W0, b0);
}

double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  const torch::Tensor e = expected.to(torch::kDouble);
  return ((actual.to(torch::kDouble) - e).norm() / e.norm()).item<double>();
}

}  // namespace afterburner::sketch::reference
