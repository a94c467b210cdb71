// oneDNN's Winograd convolution of fp32 3x3 weights, shared by the rewrite onto it
// (winograd_conv.cpp) and the convolutions fused with their activation (conv_activation.cpp).
// Internal to src/infer.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "afterburner/core/ideep_tensor.h"

namespace afterburner::infer {

// One convolution's fp32 weights, dense [out, in, 3, 3], and the Winograd transforms of them
// oneDNN has asked for: the transform's layout depends on the images (oneDNN picks F(2x2, 3x3)
// or F(4x4, 3x3) and its blocking per geometry), so each is made at the first call wanting it.
class WinogradWeights : public torch::CustomClassHolder {
 public:
  explicit WinogradWeights(at::Tensor dense)
      : dense_(std::move(dense)),
        view_({dense_.sizes().vec(), ideep::data_type::f32, ideep::format_tag::oihw}, dense_.data_ptr()) {}

  // The weights in `layout`: kept for the first kLayoutsKept layouts, made per call after them
  // (images of ever new sizes), the same values either way.
  ideep::tensor in_layout(const ideep::tensor::desc& layout) {
    const std::lock_guard<std::mutex> guard(lock_);
    for (const ideep::tensor& kept : transformed_) {
      if (kept.get_desc() == layout) return kept;
    }
    ideep::tensor transformed;
    transformed.init(layout);
    transformed.feed_from(view_);
    if (transformed_.size() < kLayoutsKept) transformed_.push_back(transformed);
    return transformed;
  }

  const ideep::tensor& dense() const { return view_; }

 private:
  static constexpr size_t kLayoutsKept = 4;
  at::Tensor dense_;
  ideep::tensor view_;  // dense_'s buffer, as oneDNN reads it
  std::mutex lock_;
  std::vector<ideep::tensor> transformed_;
};

// Registers WinogradWeights as the TorchScript class afterburner.WinogradWeights, once, whoever
// calls first: every TORCH_LIBRARY_FRAGMENT whose ops take the class calls it before their defs,
// since those fragments lie in different files and static initialisers across files run in an
// order the linker picks (one order made bench_attention abort at start: an op's schema named a
// class not yet registered).
inline void register_winograd_weights_class() {
  static const torch::class_<WinogradWeights> registered("afterburner", "WinogradWeights");
}

// y = conv2d(x, weights, bias) of stride 1 and `padding`, then `attr`'s post-ops, by oneDNN's
// Winograd kernels; nullopt where x is not a 4-D fp32 oneDNN tensor of the weights' channels,
// where Winograd does not pay for these images (winograd_pays) or where oneDNN has no Winograd
// kernel for them. Its transforms mix a tile's values: sums the direct convolution keeps finite may
// not be (convolve_on_onednn checks).
std::optional<at::Tensor> winograd_convolution(const at::Tensor& x, WinogradWeights& weights,
                                               const c10::optional<at::Tensor>& bias,
                                               const std::vector<int64_t>& padding, const ideep::attr_t& attr);

// The largest magnitude in a buffer of fp32 values, +infinity where one of them is NaN or infinite.
float largest_magnitude(const ideep::tensor& buffer);

// conv2d(x, weight, bias) as prim::mkldnn_convolution computes it on oneDNN tensors, by Winograd's
// algorithm where `winograd` is given, pays and gives finite values, else the direct way.
at::Tensor convolve_on_onednn(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                              const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                              const std::vector<int64_t>& dilation, int64_t groups,
                              const c10::intrusive_ptr<WinogradWeights>& winograd);

}  // namespace afterburner::infer
