#include "afterburner/infer/model_file.h"

#include <torch/script.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace afterburner::infer {
namespace fs = std::filesystem;

namespace {

// LibTorch's messages span many lines (with a C++ backtrace); the first says what went wrong.
std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return text.substr(0, end);
}

}  // namespace

torch::jit::Module load_model(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ModelError(path, "no such model file");
  if (!fs::is_regular_file(path, ec)) throw ModelError(path, "not a regular file");
  try {
    auto model = torch::jit::load(path, torch::kCPU);
    if (!model.find_method("forward")) throw ModelError(path, "TorchScript module has no forward method");
    return model;
  } catch (const c10::Error& e) {
    throw ModelError(path, "not a loadable TorchScript model (" + first_line(e.what_without_backtrace()) + ")");
  } catch (const ModelError&) {
    throw;
  } catch (const std::exception& e) {
    throw ModelError(path, "not a loadable TorchScript model (" + first_line(e.what()) + ")");
  }
}

void save_model(const torch::jit::Module& model, const std::string& path) {
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  try {
    model.save(temporary);
  } catch (const std::exception& e) {
    fs::remove(temporary);
    throw ModelError(path, "cannot write model (" + first_line(e.what()) + ")");
  }
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) {
    fs::remove(temporary);
    throw ModelError(path, "cannot write model (" + ec.message() + ")");
  }
}

}  // namespace afterburner::infer
