// SKLinear: a dense layer replaced by a sum of L sketched low-rank terms (as in the Panther
// library), with fewer parameters and FLOPs than torch::nn::Linear when 2Lk(d_in + d_out) is
// below d_in d_out.
//
//   namespace sketch = afterburner::sketch;
//   sketch::SKLinear layer(sketch::SKLinearOptions(1024, 768).terms(2).rank(16));
//   torch::Tensor y = layer(x);                                  // x [..., 1024] -> [..., 768]
//
//   sketch::SKLinear hidden(sketch::SKLinearOptions(1024, 768).rank(16).relu(true).dropout(0.1));
//   torch::Tensor h = hidden(x);   // dropout(relu(layer(x))) in one autograd node (kernels/low_rank.h)
//
//   torch::nn::Linear dense(1024, 768);                          // from trained weights:
//   sketch::SKLinear sketched(sketch::SKLinearOptions(1024, 768).terms(2).rank(16), dense->weight);
//
// Parameters S1s [L, d_in, k] and S2s [L, k, d_out] (trained), buffers U1s [L, k, d_out] and
// U2s [L, d_in, k] (fixed, entries +-1/sqrt(k), saved with the module), bias [d_out].
#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <ostream>

#include "afterburner/kernels/low_rank.h"

namespace afterburner::sketch {

struct SKLinearOptions {
  SKLinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(int64_t, terms) = 1;  // L
  TORCH_ARG(int64_t, rank) = 8;   // k
  TORCH_ARG(bool, bias) = true;
  // ReLU, then dropout with this probability in training, applied to the layer's output in the
  // same node: what a following torch::nn::ReLU and Dropout compute (sketch::fuse_epilogues puts
  // them here).
  TORCH_ARG(bool, relu) = false;
  TORCH_ARG(double, dropout) = 0.0;
};

// Y = 1/(2L) sum_i [ (X S1_i) U1_i + (X U2_i) S2_i ] + b, computed as two GEMMs: X times the
// concatenation [S1_1 .. S1_L, U2_1 .. U2_L] (d_in x 2Lk), then that times [U1_1; ..; U1_L;
// S2_1; ..; S2_L] (2Lk x d_out). Gradients reach X, S1s, S2s and b, never the U buffers.
class SKLinearImpl : public torch::nn::Cloneable<SKLinearImpl> {
 public:
  // `dense_weight`, in torch::nn::Linear's layout [d_out, d_in], initialises the terms so that
  // the layer estimates it (S1_i = W U1_i^T, S2_i = U2_i^T W with W = dense_weight^T); undefined:
  // a Kaiming-uniform W as torch::nn::Linear would draw. Throws UsageError for sizes below 1.
  explicit SKLinearImpl(const SKLinearOptions& options, const torch::Tensor& dense_weight = {});

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  SKLinearOptions options;
  torch::Tensor S1s, S2s, U1s, U2s, bias;  // the names of Panther's layer; bias undefined without it

 private:
  // The factors of the last call that needed no gradient for S1s and S2s, and what they were made
  // of: reused while those tensors are the same ones, unchanged (their version counters), and the
  // inference mode the same. Remaking them is two copies of the layer's weights per call (at
  // 4096 x 4096, L 2, k 64, most of an inference call's time).
  struct KeptFactors;
  std::shared_ptr<KeptFactors> kept_;
  torch::Tensor dense_weight_;  // only to initialise; not kept as a parameter
};

TORCH_MODULE(SKLinear);

// The layer's tensors, as a fresh SKLinearImpl(options, dense_weight) draws them (bias undefined
// without options.bias()). Throws UsageError for sizes below 1 or a dense weight of another shape.
struct SKLinearTensors {
  torch::Tensor S1s, S2s, U1s, U2s, bias;
};
SKLinearTensors initial_sklinear_tensors(const SKLinearOptions& options, const torch::Tensor& dense_weight = {});

// SKLinear's forward over given tensors (sizes read from their shapes; bias may be undefined):
// the op afterburner::sklinear. Throws UsageError naming the first tensor whose shape does not fit.
// `epilogue` as in kernels::low_rank_linear.
torch::Tensor sketched_linear(const torch::Tensor& input, const torch::Tensor& S1s, const torch::Tensor& S2s,
                              const torch::Tensor& U1s, const torch::Tensor& U2s, const torch::Tensor& bias,
                              const kernels::LowRankEpilogue& epilogue = {});

// The two GEMM operands of that forward: first = [S1_1 .. S1_L, U2_1 .. U2_L] [d_in, w] and
// second = [U1_1; ..; U1_L; S2_1; ..; S2_L] [w, d_out] (w = 2Lk, zero-padded to a width the GEMM
// runs faster at), and scale = 1/(2L). Differentiable in S1s and S2s. Throws UsageError naming
// the first tensor whose shape does not fit.
struct SKLinearFactors {
  torch::Tensor first, second;
  double scale = 1.0;
};
SKLinearFactors sklinear_factors(const torch::Tensor& S1s, const torch::Tensor& S2s, const torch::Tensor& U1s,
                                 const torch::Tensor& U2s);

// y = scale (input first) second + bias for input [..., d_in]: the forward from factors made
// once (the op afterburner::sklinear_factored). Throws UsageError for an input or bias that does
// not fit.
torch::Tensor sketched_linear(const torch::Tensor& input, const SKLinearFactors& factors, const torch::Tensor& bias,
                              const kernels::LowRankEpilogue& epilogue = {});

// True when 2Lk(d_in + d_out) > d_in d_out: the sketched layer has more parameters than the
// dense one.
bool sketch_saves_nothing(const SKLinearOptions& options);

}  // namespace afterburner::sketch
