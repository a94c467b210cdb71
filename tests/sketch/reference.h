// The sketched layers' definitions computed term by term, the independent references the
// sketch tests compare against (in double when given doubles).
#pragma once

#include <torch/types.h>

namespace afterburner::sketch::reference {

// 1/(2L) sum_i [ (X S1_i) U1_i + (X U2_i) S2_i ] + b, for X [B, d_in].
torch::Tensor sklinear(const torch::Tensor& x, const torch::Tensor& s1, const torch::Tensor& s2,
                       const torch::Tensor& u1, const torch::Tensor& u2, const torch::Tensor& bias);

// Y[:, o] = 1/(2L) sum_{i, kappa} U1_i[kappa, o] conv2d(X, S1s[i k + kappa]) + b[o].
torch::Tensor skconv2d(const torch::Tensor& x, const torch::Tensor& s1, const torch::Tensor& u1,
                       const torch::Tensor& bias, torch::IntArrayRef stride, torch::IntArrayRef padding);

// ||actual - expected|| / ||expected||, computed in double.
double relative_error(const torch::Tensor& actual, const torch::Tensor& expected);

}  // namespace afterburner::sketch::reference
