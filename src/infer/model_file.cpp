#include "afterburner/infer/model_file.h"

#include <torch/script.h>

#include <filesystem>
#include <unordered_map>

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

std::string read_model_metadata(const std::string& path) {
  try {  // the one record, not the weights
    return read_archive_record(path, std::string("/extra/") + kMetadataFile).value_or("");
  } catch (const ArchiveError& e) {
    throw ModelError(path, "not a loadable TorchScript model (" + e.problem() + ")");
  }
}

void save_model(const torch::jit::Module& model, const std::string& path, const std::string& metadata) {
  try {
    write_file_atomically(path, model,
                          metadata.empty() ? torch::jit::ExtraFilesMap{} : torch::jit::ExtraFilesMap{{kMetadataFile, metadata}});
  } catch (const FileWriteError& e) {
    throw ModelError(path, e.problem());
  } catch (const c10::Error& e) {
    throw ModelError(path, "cannot write model (" + first_line(e) + ")");
  }
}

namespace {

// Copies tensors once each, and each storage once, so that aliasing survives the copy.
class AliasPreservingCopier {
 public:
  c10::IValue copy(const c10::IValue& value) {
    if (value.isTensor()) return copy(value.toTensor());
    return value.deepcopy(memo_);  // lists, tuples and custom classes (packed weights), as clone() does
  }

 private:
  at::Tensor copy(const at::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    auto known = tensors_.find(tensor.unsafeGetTensorImpl());
    if (known != tensors_.end()) return known->second;
    torch::NoGradGuard no_grad;
    at::Tensor copied;
    if (tensor.layout() == at::kStrided && !tensor.is_quantized() && tensor.has_storage()) {
      copied = at::empty({0}, tensor.options())
                   .set_(storage_copy(tensor.storage()), tensor.storage_offset(), tensor.sizes(), tensor.strides());
    } else {
      copied = tensor.clone();  // mkldnn, sparse, quantized: nothing of theirs is viewed by another tensor
    }
    copied.requires_grad_(tensor.requires_grad());
    tensors_.emplace(tensor.unsafeGetTensorImpl(), copied);
    return copied;
  }

  c10::Storage storage_copy(const c10::Storage& storage) {
    auto known = storages_.find(storage.unsafeGetStorageImpl());
    if (known != storages_.end()) return known->second;
    const auto bytes = static_cast<int64_t>(storage.nbytes());
    at::Tensor raw = at::empty({0}, at::TensorOptions(at::kByte).device(storage.device())).set_(storage, 0, {bytes}, {1});
    c10::Storage copied = raw.clone().storage();
    storages_.emplace(storage.unsafeGetStorageImpl(), copied);
    return copied;
  }

  std::unordered_map<const c10::TensorImpl*, at::Tensor> tensors_;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> storages_;
  c10::IValue::HashAliasedIValueMap memo_;
};

}  // namespace

torch::jit::Module copy_model(const torch::jit::Module& model) {
  // clone(inplace) gives every module (and type) a copy of its own but shares the slots'
  // values; each slot that is not a submodule then gets its copy.
  torch::jit::Module copy = model.clone(/*inplace=*/true);
  AliasPreservingCopier copier;
  for (const torch::jit::Module& module : copy.modules()) {
    const auto object = module._ivalue();
    for (size_t i = 0; i < object->slots().size(); ++i) {
      const c10::IValue& slot = object->getSlot(i);
      const bool submodule = slot.isObject() && slot.toObjectRef().type()->is_module();
      if (!submodule) object->setSlot(i, copier.copy(slot));
    }
  }
  return copy;
}

}  // namespace afterburner::infer
