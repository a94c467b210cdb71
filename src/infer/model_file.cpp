#include "afterburner/infer/model_file.h"

#include <torch/script.h>

#include <filesystem>

#include "afterburner/core/archive.h"
#include "afterburner/core/file_writer.h"

namespace afterburner::infer {
namespace fs = std::filesystem;

torch::jit::Module load_model(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ModelError(path, "no such model file");
  if (!fs::is_regular_file(path, ec)) throw ModelError(path, "not a regular file");
  try {
    check_archive(path);
    auto model = torch::jit::load(path, torch::kCPU);
    if (!model.find_method("forward")) throw ModelError(path, "TorchScript module has no forward method");
    return model;
  } catch (const ArchiveError& e) {
    throw ModelError(path, "not a loadable TorchScript model (" + e.problem() + ")");
  } catch (const ModelError&) {
    throw;
  } catch (const std::exception& e) {
    throw ModelError(path, "not a loadable TorchScript model (" + first_line(e) + ")");
  }
}

void save_model(const torch::jit::Module& model, const std::string& path) {
  try {
    write_file_atomically(path, model);
  } catch (const FileWriteError& e) {
    throw ModelError(path, e.problem());
  } catch (const c10::Error& e) {
    throw ModelError(path, "cannot write model (" + first_line(e) + ")");
  }
}

}  // namespace afterburner::infer
