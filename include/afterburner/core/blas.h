// Which BLAS the process really loaded. Debian's libtorch runs on whatever libblas.so.3
// the alternatives system points at; the reference (netlib) one is ~50x slower for GEMM.
//
//   auto blas = afterburner::detect_blas();
//   if (blas.is_reference) std::cerr << afterburner::blas_warning(blas) << "\n";
#pragma once

#include <string>

namespace afterburner {

struct BlasInfo {
  std::string name;         // "OpenBLAS", "MKL", "BLIS", "reference", or "unknown"
  std::string detail;       // version/config string or the library path
  bool is_reference = false;
};

// Looks at the symbols and shared objects of this process; call after libtorch is loaded.
BlasInfo detect_blas();

// One line telling the user how to get a fast BLAS.
std::string blas_warning(const BlasInfo& info);

// OpenBLAS's own thread pool, which LibTorch's thread count does not govern (its GEMMs would use
// every core, their idle threads spinning, whatever at::set_num_threads said). 0 when the BLAS
// loaded is not OpenBLAS, whose count set_blas_threads then leaves alone.
int blas_threads();
void set_blas_threads(int n);

}  // namespace afterburner
