// What keeps a oneDNN convolution's sums finite, for the rewrites that compute a convolution
// otherwise than LibTorch's graph would (fused activations, pooling first): where the sums are
// bounded below kFiniteSums they compute the same non-finite values as the graph (none), else they
// fall back to the graph's own ops. Internal to src/infer.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <optional>
#include <utility>

namespace afterburner::infer {

// Sums below 2^100 are finite whatever Winograd's transforms scale partial sums by (fp32 ends at
// 2^128), and stay so added up four at a time (an average pooling's window).
constexpr double kFiniteSums = 0x1p100;

// The largest sum of one output channel's weight magnitudes and the largest bias magnitude of a
// convolution whose weight (and bias, if any) are fp32 oneDNN constants; nullopt for other
// convolutions. |sum| <= max|x| * the first + the second.
std::optional<std::pair<double, double>> sum_bounds(const torch::jit::Node* conv);

}  // namespace afterburner::infer
