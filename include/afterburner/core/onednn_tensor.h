// The buffer behind a LibTorch oneDNN tensor (what `to_mkldnn()` and `optimize_for_inference`
// make), for kernels of ours that read and write oneDNN's layouts directly instead of converting
// to dense tensors and back.
//
//   if (auto images = afterburner::onednn_images(x)) {          // x.is_mkldnn(), 4-D
//     auto out = afterburner::empty_onednn_images(x, {n, c, h / 2, w / 2});
//     my_kernel(images->data, afterburner::onednn_images(out)->data, ...);
//   }
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace afterburner {

// How a 4-D [N, C, H, W] oneDNN tensor lays out its values, and the layouts a kernel sees them
// in: `images` of [height][width][depth] values each, one after another. Plain NCHW is N*C images
// of depth 1; plain NHWC is N images of depth C; oneDNN's channel-blocked nChw8c / nChw16c (what
// its convolutions produce) is N * padded_channels / b images of depth b, where the channels past
// C up to padded_channels hold zeros.
struct OnednnImages {
  void* data;
  at::ScalarType dtype;
  int64_t images, height, width, depth;
  int64_t padded_channels;
};

// The layout of a dense-in-memory 4-D oneDNN tensor of fp32 or bf16 in one of the layouts above;
// nullopt for anything else (other ranks, dtypes or oneDNN formats, or `tensor` not oneDNN's).
std::optional<OnednnImages> onednn_images(const at::Tensor& tensor);

// A new oneDNN tensor of `sizes` ([N, C, H, W]) in `like`'s layout and dtype (see onednn_images),
// its padding channels zero and the rest uninitialised.
at::Tensor empty_onednn_images(const at::Tensor& like, at::IntArrayRef sizes);

// Sets the padding channels of `images` (those past `channels`) to 0, as oneDNN keeps them: the
// next convolution reads them. Nothing to do where no block is padded.
void zero_padding_channels(const OnednnImages& images, int64_t channels);

}  // namespace afterburner
