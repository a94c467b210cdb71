// LibTorch's oneDNN tensors (`to_mkldnn()`, optimize_for_inference's) as the ideep tensors behind
// them, and ideep tensors of ours as LibTorch tensors, for kernels that call oneDNN through ideep
// (Debian's libideep-dev, the header-only wrapper LibTorch's own oneDNN ops speak).
//
//   ideep::tensor& packed = afterburner::ideep_tensor(weight);        // weight.is_mkldnn()
//   at::Tensor held = afterburner::onednn_tensor(std::move(buffer));  // a MkldnnCPU tensor
#pragma once

#include <ATen/core/Tensor.h>
#include <ideep.hpp>

namespace afterburner {

// The ideep tensor behind a oneDNN (MkldnnCPU) tensor: its buffer and layout, not a copy.
ideep::tensor& ideep_tensor(const at::Tensor& mkldnn_tensor);

// A CPU oneDNN tensor owning `buffer` (fp32 or bf16, as its data type says).
at::Tensor onednn_tensor(ideep::tensor&& buffer);

}  // namespace afterburner
