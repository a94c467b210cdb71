#include "afterburner/core/blas.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <string>

namespace afterburner {
namespace {

void* symbol(const char* name) { return dlsym(RTLD_DEFAULT, name); }

// Path of the loaded shared object whose file name starts with `prefix`, or "".
std::string loaded_library(const char* prefix) {
  struct Search {
    const char* prefix;
    std::string found;
  } search{prefix, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const char* slash = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
        const char* base = slash ? slash + 1 : info->dlpi_name;
        if (base && std::strncmp(base, s->prefix, std::strlen(s->prefix)) == 0) {
          s->found = info->dlpi_name;
          return 1;
        }
        return 0;
      },
      &search);
  return search.found;
}

}  // namespace

BlasInfo detect_blas() {
  if (auto* config = reinterpret_cast<const char* (*)()>(symbol("openblas_get_config"))) {
    return {"OpenBLAS", config(), false};
  }
  if (symbol("mkl_get_version") || symbol("MKL_Get_Version")) return {"MKL", "", false};
  if (symbol("bli_info_get_version_str")) return {"BLIS", "", false};
  std::string reference = loaded_library("libblas.so");
  if (!reference.empty()) return {"reference", reference, true};
  return {"unknown", "", false};
}

int blas_threads() {
  auto* get = reinterpret_cast<int (*)()>(symbol("openblas_get_num_threads"));
  return get ? get() : 0;
}

void set_blas_threads(int n) {
  if (auto* set = reinterpret_cast<void (*)(int)>(symbol("openblas_set_num_threads"))) set(n);
}

std::string blas_warning(const BlasInfo& info) {
  return "warning: the reference BLAS (" + info.detail +
         ") is loaded: matrix products run ~50x slower; install libopenblas0-pthread "
         "(apt-get install libopenblas0-pthread)";
}

}  // namespace afterburner
