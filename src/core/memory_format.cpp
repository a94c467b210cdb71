#include "afterburner/core/memory_format.h"

namespace afterburner {

torch::Tensor channels_last(const torch::Tensor& tensor) {
  if (tensor.suggest_memory_format() == at::MemoryFormat::ChannelsLast) return tensor;
  return at::empty_like(tensor, at::MemoryFormat::ChannelsLast).copy_(tensor);
}

}  // namespace afterburner
