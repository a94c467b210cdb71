// core's process-wide settings (core/heap.h), CPU facts and memory-format helper as dispatcher ops, so
// Python reaches them through torch.ops.afterburner (afterburner.heap, afterburner.optimize)
// without bindings of its own.
#include <torch/library.h>

#include "afterburner/core/cpu.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/memory_format.h"

TORCH_LIBRARY_FRAGMENT(afterburner, m) {
  m.def("keep_freed_memory() -> bool", afterburner::keep_freed_memory);
  m.def("release_freed_memory() -> ()", afterburner::release_freed_memory);
  m.def("cpu_has_native_bf16() -> bool", afterburner::cpu_has_native_bf16);
  // The tensor laid out channels_last so that LibTorch sees it so, one channel included: the
  // tensor itself where it already is (so the result may alias it), else a copy.
  m.def("channels_last(Tensor(a) tensor) -> Tensor(a)", afterburner::channels_last);
}
