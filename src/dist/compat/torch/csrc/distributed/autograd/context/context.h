// c10d/reducer.hpp includes this header of LibTorch's distributed autograd, which Debian's
// libtorch-dev does not ship. The Reducer uses two of its names, declared here exactly as
// LibTorch declares them (a std::function and a std::shared_ptr: the same layout whatever the
// class holds), so that reducer.hpp compiles against the Reducer that libtorch_cpu.so exports.
// Only src/dist sees this directory.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::distributed::autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};

using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace torch::distributed::autograd
