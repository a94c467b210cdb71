#include "afterburner/kernels/channel_concat.h"

#include "afterburner/core/ideep_tensor.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <atomic>
#include <vector>

namespace afterburner::kernels {
namespace {

// The context of a buffer's memory: the allocation, and how many channels its widest result
// shows. An append claims the channels after those atomically, so a buffer is written once per
// channel and never under a result handed out before.
struct ChannelBuffer {
  c10::DataPtr memory;
  std::atomic<int64_t> channels_shown;
};

void free_buffer(void* context) { delete static_cast<ChannelBuffer*>(context); }

// The buffer `t` lies in, if it is one made here.
ChannelBuffer* buffer_of(const at::Tensor& t) {
  if (!t.has_storage()) return nullptr;
  const c10::DataPtr& data = t.storage().data_ptr();
  return data.get_deleter() == &free_buffer ? static_cast<ChannelBuffer*>(data.get_context()) : nullptr;
}

// A dense CPU tensor not laid out channels-last, or a fp32 oneDNN one (a convolution's output in
// an optimized graph). at::cat keeps channels-last inputs channels-last, as the convolutions
// reading them want (bf16 graphs); a slice of a buffer made here would be copied again there.
bool copyable(const at::Tensor& t) {
  if (t.is_mkldnn()) return t.scalar_type() == at::kFloat;
  return t.layout() == at::kStrided && t.device().is_cpu() && t.suggest_memory_format() == at::MemoryFormat::Contiguous;
}

// Whether torch.cat(tensors, 1) only copies each tensor into its channels: copyable tensors of
// one dtype and rank (at least 2), the same sizes but in dim 1, and something to copy.
bool plain_copies(at::TensorList tensors) {
  if (tensors.empty()) return false;
  const at::Tensor& first = tensors[0];
  if (first.dim() < 2 || first.numel() == 0) return false;
  for (const at::Tensor& t : tensors) {
    if (!copyable(t) || t.dim() != first.dim() || t.scalar_type() != first.scalar_type()) return false;
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d != 1 && t.size(d) != first.size(d)) return false;
    }
  }
  return true;
}

int64_t channels_of(at::TensorList tensors) {
  int64_t channels = 0;
  for (const at::Tensor& t : tensors) channels += t.size(1);
  return channels;
}

// A new dense buffer shaped as `like` with `capacity` channels, of which `shown` will be shown.
at::Tensor new_buffer(const at::Tensor& like, int64_t capacity, int64_t shown) {
  std::vector<int64_t> sizes = like.sizes().vec();
  sizes[1] = capacity;
  int64_t elements = 1;
  for (const int64_t size : sizes) elements *= size;
  const size_t bytes = static_cast<size_t>(elements) * like.element_size();
  auto* buffer = new ChannelBuffer{c10::GetCPUAllocator()->allocate(bytes), shown};
  c10::DataPtr data(buffer->memory.get(), buffer, &free_buffer, at::Device(at::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), /*allocator=*/nullptr,
                       /*resizable=*/false);
  return at::empty({0}, like.options().layout(at::kStrided)).set_(storage, 0, sizes, c10::contiguous_strides(sizes));
}

// Copies `tensors` into the channels of `whole` from `offset` on; a oneDNN tensor by one reorder
// from its layout into the channels' strides (what to_dense and a copy would do in two passes).
void copy_into(const at::Tensor& whole, at::TensorList tensors, int64_t offset) {
  for (const at::Tensor& t : tensors) {
    at::Tensor channels = whole.narrow(1, offset, t.size(1));
    if (t.is_mkldnn()) {
      ideep::tensor into({channels.sizes().vec(), ideep::data_type::f32, channels.strides().vec()}, channels.data_ptr());
      ideep_tensor(t).reorder_to(into);
    } else {
      channels.copy_(t);
    }
    offset += t.size(1);
  }
}

// at::cat's answer, oneDNN tensors read as their dense values.
at::Tensor cat_of_dense(at::TensorList tensors) {
  std::vector<at::Tensor> dense;
  for (const at::Tensor& t : tensors) dense.push_back(t.is_mkldnn() ? t.to_dense() : t);
  return at::cat(dense, 1);
}

// The whole buffer `held` is the first channels of, when it is laid out as this file lays out
// buffers ([N, capacity, ...] contiguous, held from its start).
c10::optional<at::Tensor> whole_buffer_of(const at::Tensor& held) {
  if (held.storage_offset() != 0 || held.stride(1) == 0) return c10::nullopt;
  const int64_t capacity = held.stride(0) / held.stride(1);
  std::vector<int64_t> sizes = held.sizes().vec();
  sizes[1] = capacity;
  const auto strides = c10::contiguous_strides(sizes);
  if (!held.strides().equals(strides) ||
      held.storage().nbytes() < static_cast<size_t>(strides[0] * sizes[0]) * held.element_size()) {
    return c10::nullopt;
  }
  return held.as_strided(sizes, strides);
}

}  // namespace

// out = cat(tensors, 1): a copy of each tensor's values into its channels of a new buffer.
at::Tensor concat_reserve(at::TensorList tensors, int64_t spare) {
  if (!plain_copies(tensors) || spare < 0) return cat_of_dense(tensors);
  const int64_t channels = channels_of(tensors);
  const at::Tensor whole = new_buffer(tensors[0], channels + spare, channels);
  copy_into(whole, tensors, 0);
  return whole.narrow(1, 0, channels);
}

// out = cat([held, *more], 1): held's values stay where they are, more's are copied after them.
at::Tensor concat_append(const at::Tensor& held, at::TensorList more, int64_t spare) {
  std::vector<at::Tensor> all{held};
  all.insert(all.end(), more.begin(), more.end());
  if (!plain_copies(all)) return cat_of_dense(all);
  ChannelBuffer* buffer = buffer_of(held);
  c10::optional<at::Tensor> whole;
  if (buffer) whole = whole_buffer_of(held);
  const int64_t shown = held.size(1), added = channels_of(more);
  int64_t claimed = shown;
  if (!whole || whole->size(1) < shown + added || !buffer->channels_shown.compare_exchange_strong(claimed, shown + added)) {
    return concat_reserve(all, spare);
  }
  copy_into(*whole, more, shown);
  return whole->narrow(1, 0, shown + added);
}

TORCH_LIBRARY_IMPL(afterburner, CompositeExplicitAutograd, m) {
  m.impl("concat_reserve", TORCH_FN(concat_reserve));
  m.impl("concat_append", TORCH_FN(concat_append));
}

}  // namespace afterburner::kernels
