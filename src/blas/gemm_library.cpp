// The choice of library per precision (blas/gemm_library.hpp) and its line in the run log.
#include "blas/gemm_library.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

#include "blas/gemm.hpp"
#include "blas/onednn_gemm.hpp"
#include "kernels/views.hpp"

namespace tessera::blas {
namespace {

std::atomic<GemmLibrary> choice{GemmLibrary::automatic};

constexpr bool kDeviceMemory = !std::is_same_v<MemSpace, HostSpace>;

}  // namespace

void set_gemm_library(GemmLibrary g) {
  if (g == GemmLibrary::onednn && !onednn::available())
    throw std::invalid_argument("tessera::blas::set_gemm_library: run.gemm = \"onednn\" in a build without oneDNN");
  choice = g;
}

GemmLibrary gemm_library() { return choice; }

Library automatic_library(Precision p) {
  if (!onednn::available()) return Library::openblas;
  if (p == Precision::bf16 && onednn::native_bf16()) return Library::onednn;
  // fp32: oneDNN's brgemm beat OpenBLAS on AVX-512 in every sitting measured (docs/precision.md);
  // below AVX-512 it was not measured, so OpenBLAS keeps it there.
  if (p == Precision::fp32 && onednn::isa().rfind("avx512_core", 0) == 0) return Library::onednn;
  return Library::openblas;
}

Library library_for(Precision p) {
  switch (choice.load()) {
    case GemmLibrary::openblas: return Library::openblas;
    case GemmLibrary::onednn:
      // oneDNN here has no fp16 product, and no bf16 one below AVX-512: those stay on OpenBLAS.
      if (p == Precision::fp16 || (p == Precision::bf16 && !onednn::bf16_supported())) return Library::openblas;
      return Library::onednn;
    case GemmLibrary::automatic: break;
  }
  return automatic_library(p);
}

const char* library_name(Library l) { return l == Library::onednn ? "onednn" : "openblas"; }

std::string describe_gemm() {
  if (kDeviceMemory) return std::string("gemm: cuBLAS (device memory); run.gemm = ") + gemm_library_name(choice);
  std::string line = "gemm:";
  const char* sep = " ";
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    const Library l = library_for(p);
    const std::string what = l == Library::onednn ? onednn::implementation(p == Precision::bf16) : lowp_path(p);
    line += std::string(sep) + precision_name(p) + " -> " + library_name(l) + " (" + what + ")";
    sep = ", ";
  }
  line += std::string("; run.gemm = ") + gemm_library_name(choice);
  if (onednn::available()) line += "; oneDNN on " + onednn::isa();
  const bool bf16_fast = library_for(Precision::bf16) == Library::onednn
                             ? onednn::native_bf16()
                             : std::string(lowp_path(Precision::bf16)) == "cblas_sbgemm";
  if (!bf16_fast)
    line += "; bf16 is correct but not fast here (no native bf16 product: " +
            std::string(onednn::native_bf16() ? "run.gemm = openblas and OpenBLAS lacks cblas_sbgemm"
                                              : "this CPU has no bf16 instructions oneDNN uses") + ")";
  return line;
}

}  // namespace tessera::blas
