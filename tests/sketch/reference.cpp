#include "reference.h"

#include <torch/torch.h>

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

double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  const torch::Tensor e = expected.to(torch::kDouble);
  return ((actual.to(torch::kDouble) - e).norm() / e.norm()).item<double>();
}

}  // namespace afterburner::sketch::reference
