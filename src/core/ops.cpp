// The process-wide settings of core/heap.h as dispatcher ops, so Python reaches them through
// torch.ops.afterburner (afterburner.heap) without bindings of its own.
#include <torch/library.h>

#include "afterburner/core/heap.h"

TORCH_LIBRARY_FRAGMENT(afterburner, m) {
  m.def("keep_freed_memory() -> bool", afterburner::keep_freed_memory);
  m.def("release_freed_memory() -> ()", afterburner::release_freed_memory);
}
