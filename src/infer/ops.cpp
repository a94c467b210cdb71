// infer's optimize and prepare_for_inference as one dispatcher op, for Python's
// afterburner.optimize (a model in evaluation mode, no optimizer): the module frozen, BatchNorm
// folded, optionally bf16, then on oneDNN's layouts, and the passes that changed it.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/infer/optimize.h"

namespace afterburner::infer {
namespace {

std::tuple<c10::IValue, std::vector<std::string>> optimize_for_inference(const c10::IValue& module,
                                                                         const std::string& precision) {
  if (!module.isObject() || !module.toObject()->type()->is_module()) {
    throw UsageError("module", "expected a TorchScript module, got " + module.type()->repr_str());
  }
  OptimizeResult optimized = optimize(torch::jit::Module(module.toObject()),
                                      OptimizeOptions().precision(parse_precision(precision)));
  return {prepare_for_inference(optimized.model)._ivalue(), std::move(optimized.passes)};
}

TORCH_LIBRARY_FRAGMENT(afterburner, m) {  // the library is src/kernels/ops.cpp
  m.def("optimize_for_inference(Any module, str precision=\"fp32\") -> (Any, str[])", optimize_for_inference);
}

}  // namespace
}  // namespace afterburner::infer
