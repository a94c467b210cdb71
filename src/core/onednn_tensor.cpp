#include "afterburner/core/onednn_tensor.h"

#include <ATen/core/TensorBody.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <cstring>

#include "afterburner/core/ideep_tensor.h"

// LibTorch exports these (ATen/native/mkldnn/MKLDNNCommon.h, a header Debian's libtorch-dev does
// not ship); ideep, the header-only wrapper of oneDNN they speak, is Debian's libideep-dev (the
// packaged snapshot of August 2022; tests/core/onednn_tensor_test reads tensors
// LibTorch made through it element by element).
namespace at::native {
TORCH_API ideep::tensor& itensor_from_mkldnn(const at::Tensor& mkldnn_tensor);
TORCH_API at::Tensor new_with_itensor_mkldnn(ideep::tensor&& it, c10::optional<at::ScalarType> dtype,
                                             c10::optional<c10::Device> device);
}  // namespace at::native

namespace afterburner {
namespace {

using Tag = ideep::format_tag;

std::optional<at::ScalarType> scalar_type_of(ideep::data_type type) {
  if (type == ideep::data_type::f32) return at::kFloat;
  if (type == ideep::data_type::bf16) return at::kBFloat16;
  return std::nullopt;
}

// The oneDNN format tag of `desc` among those OnednnImages describes.
std::optional<Tag> image_format(const dnnl_memory_desc_t& desc) {
  if (desc.ndims != 4 || desc.format_kind != dnnl_blocked || desc.offset0 != 0) return std::nullopt;
  const auto& blocking = desc.format_desc.blocking;
  const int64_t c = desc.dims[1], h = desc.dims[2], w = desc.dims[3];
  const int64_t* strides = blocking.strides;
  if (blocking.inner_nblks == 0) {
    if (strides[0] == c * h * w && strides[1] == h * w && strides[2] == w && strides[3] == 1) return Tag::nchw;
    if (strides[0] == h * w * c && strides[1] == 1 && strides[2] == w * c && strides[3] == c) return Tag::nhwc;
    return std::nullopt;
  }
  const int64_t block = blocking.inner_blks[0];
  const int64_t padded = desc.padded_dims[1];
  if (blocking.inner_nblks != 1 || blocking.inner_idxs[0] != 1 || (block != 8 && block != 16) || padded % block != 0 ||
      strides[0] != padded * h * w || strides[1] != h * w * block || strides[2] != w * block || strides[3] != block) {
    return std::nullopt;
  }
  return block == 8 ? Tag::nChw8c : Tag::nChw16c;
}

}  // namespace

// ideep checks that the caller runs below autograd; reading a buffer does not dispatch.
ideep::tensor& ideep_tensor(const at::Tensor& mkldnn_tensor) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return at::native::itensor_from_mkldnn(mkldnn_tensor);
}

at::Tensor onednn_tensor(ideep::tensor&& buffer) {
  const auto dtype = scalar_type_of(buffer.get_data_type());
  TORCH_CHECK(dtype.has_value(), "onednn_tensor: an fp32 or bf16 buffer was expected");
  return at::native::new_with_itensor_mkldnn(std::move(buffer), *dtype, at::Device(at::kCPU));
}

std::optional<OnednnImages> onednn_images(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_mkldnn() || tensor.dim() != 4) return std::nullopt;
  ideep::tensor& it = ideep_tensor(tensor);
  const dnnl_memory_desc_t& desc = it.get_desc().data;
  const auto dtype = scalar_type_of(it.get_data_type());
  const auto format = image_format(desc);
  if (!dtype || !format) return std::nullopt;
  const int64_t n = desc.dims[0], c = desc.dims[1], padded = desc.padded_dims[1];
  OnednnImages images{it.get_data_handle(), *dtype, 0, desc.dims[2], desc.dims[3], 0, padded};
  switch (*format) {
    case Tag::nchw:
      images.images = n * c;
      images.depth = 1;
      break;
    case Tag::nhwc:
      images.images = n;
      images.depth = c;
      break;
    default: {
      const int64_t block = desc.format_desc.blocking.inner_blks[0];
      images.images = n * padded / block;
      images.depth = block;
    }
  }
  return images;
}

at::Tensor empty_onednn_images(const at::Tensor& like, at::IntArrayRef sizes) {
  ideep::tensor& it = ideep_tensor(like);
  const auto format = image_format(it.get_desc().data);
  TORCH_CHECK(format && sizes.size() == 4, "empty_onednn_images: `like` is not in a layout of OnednnImages");
  ideep::tensor buffer({sizes.begin(), sizes.end()}, it.get_data_type(), *format);
  at::Tensor out = onednn_tensor(std::move(buffer));
  zero_padding_channels(*onednn_images(out), sizes[1]);
  return out;
}

void zero_padding_channels(const OnednnImages& images, int64_t channels) {
  if (images.padded_channels == channels) return;
  const int64_t element = at::elementSize(images.dtype);
  const int64_t blocks = images.padded_channels / images.depth;
  const int64_t real = channels % images.depth;  // in the last block of each sample
  const int64_t positions = images.height * images.width;
  auto* data = static_cast<char*>(images.data);
  for (int64_t image = blocks - 1; image < images.images; image += blocks) {
    for (int64_t position = 0; position < positions; ++position) {
      std::memset(data + ((image * positions + position) * images.depth + real) * element, 0,
                  (images.depth - real) * element);
    }
  }
}

}  // namespace afterburner
