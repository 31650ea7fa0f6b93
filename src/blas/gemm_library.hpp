#pragma once
// Which library runs each precision's host matrix products: OpenBLAS or oneDNN (run.gemm).
// CUDA memory keeps cuBLAS whatever this says.
#include <string>

#include "core/gemm_library.hpp"
#include "core/precision.hpp"

namespace tessera::blas {

/// The library behind one precision's host products.
enum class Library { openblas, onednn };

/// \brief Applies run.gemm for every host product of this process from now on: openblas or
/// onednn force one library (fp16 stays emulated on OpenBLAS: oneDNN here has no fp16 product;
/// so does bf16 on a CPU where oneDNN has no bf16 matmul, below AVX-512),
/// automatic takes the table of automatic_library(). Throws std::invalid_argument for onednn in
/// a build without it (the deck check refuses that first).
void set_gemm_library(GemmLibrary choice);
GemmLibrary gemm_library();

/// \brief What run.gemm = "auto" picks for p on this CPU and build: bf16 -> onednn where oneDNN
/// has native bf16 instructions (AVX512-BF16, AMX), else openblas (cblas_sbgemm or emulated);
/// fp32 -> onednn where oneDNN runs AVX-512 (avx512_core and up), else openblas; fp16 ->
/// openblas (the measurements behind the table: docs/precision.md).
Library automatic_library(Precision p);

/// \brief The library that runs p's host products now.
Library library_for(Precision p);
const char* library_name(Library l);

/// \brief One line for the run log naming, for every precision, the library and what it runs,
/// e.g. "gemm: fp32 -> openblas (cblas_sgemm), bf16 -> onednn (brg:avx512_core_bf16), fp16 ->
/// openblas (emulated (rounded operands, sgemm)); run.gemm = auto; oneDNN on avx512_core_bf16",
/// with a note where bf16 is correct but not fast on this CPU.
std::string describe_gemm();

}  // namespace tessera::blas
