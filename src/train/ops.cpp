// What Python's afterburner.optimize asks of train: whether bf16 runs natively on this CPU.
#include <torch/library.h>

#include "afterburner/train/precision.h"

TORCH_LIBRARY_FRAGMENT(afterburner, m) {
  m.def("cpu_has_native_bf16() -> bool", afterburner::train::cpu_has_native_bf16);
}
