// TorchScript model files: loading with errors that name the file, and atomic writes.
//
//   auto model = afterburner::infer::load_model("cnn.pt");   // throws ModelError naming the file
//   afterburner::infer::save_model(model, "cnn-opt.pt");     // tmp file + rename: all or nothing
//   auto mine = afterburner::infer::copy_model(model);        // a deep copy passes may rewrite
#pragma once

#include <torch/csrc/jit/api/module.h>

#include <string>

#include "afterburner/core/error.h"

namespace afterburner::infer {

// A model file that is missing, is not TorchScript, or cannot be written.
class ModelError : public Error {
 public:
  ModelError(const std::string& file, const std::string& problem) : Error(file + ": " + problem) {}
};

// Loads on the CPU. Throws ModelError naming `path` for a missing file, a file that is not a
// TorchScript archive, or one whose code cannot be compiled; the message is one line.
torch::jit::Module load_model(const std::string& path);

// What `afterburner train --export` says of the model it writes, kept in the file beside it (the
// archive's extra file afterburner.json; Python: torch.jit.load(path, _extra_files={
// "afterburner.json": ""})): the class names its outputs index and the normalisation its input
// takes. `optimize` carries it over.
constexpr const char* kMetadataFile = "afterburner.json";

// The model file's afterburner.json, "" when it has none. Throws ModelError as load_model.
std::string read_model_metadata(const std::string& path);

// Writes through a temporary file renamed over `path` (core/file_writer.h), so a reader never
// sees a partial file and a failed write leaves `path` as it was; with `metadata`, as its
// afterburner.json. Throws ModelError naming `path`.
void save_model(const torch::jit::Module& model, const std::string& path, const std::string& metadata = "");

// A deep copy: types, submodules and tensors of its own, each tensor aliasing the copy's others
// exactly as the original's alias each other (tied weights stay one tensor; views of one
// storage, as a flat optimizer's parameters or a file saved from them, stay views of one new
// storage). Module::clone() is not that: LibTorch's IValue::deepcopy memoises tensors by their
// storage, so two parameters sharing a storage come back as one (a file whose parameters are
// views of one buffer had each bias replaced by its layer's weight).
torch::jit::Module copy_model(const torch::jit::Module& model);

}  // namespace afterburner::infer
