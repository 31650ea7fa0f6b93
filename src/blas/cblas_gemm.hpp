#pragma once
// Host GEMM through CBLAS (row-major). Used by blas/gemm.hpp when MemSpace is host memory;
// callable directly for host buffers (benchmarks, tests).
#include <cstdint>

#include "blas/gemm.hpp"

namespace tessera::blas::cblas {

void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
void gemm(Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

/// \brief Throws std::invalid_argument unless m, n, k >= 0 and every row-major leading dimension
/// covers its stored row: lda >= (ta == N ? k : m), ldb >= (tb == N ? n : k), ldc >= n (each >= 1).
void check_args(Op ta, Op tb, int m, int n, int k, int lda, int ldb, int ldc);

/// \brief A row-major bf16 GEMM with fp32 accumulation: C (m x n, fp32) = alpha op(A) op(B) +
/// beta C, where A and B hold bf16 bit patterns. The signature of OpenBLAS's cblas_sbgemm with
/// the CBLAS enums and blasint replaced, so callers need no cblas.h.
using SbgemmFn = void (*)(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A,
                          int lda, const std::uint16_t* B, int ldb, float beta, float* C, int ldc);

/// \brief The bf16 GEMM in use: OpenBLAS's cblas_sbgemm where the loaded library exports it
/// (looked up once, at the first call, with dlsym(RTLD_DEFAULT); only OpenBLAS built with
/// BUILD_BFLOAT16 has it), else nullptr; or what set_sbgemm installed.
SbgemmFn sbgemm();

/// \brief True when fn is the adapter around the library's own cblas_sbgemm.
bool is_library_sbgemm(SbgemmFn fn);

/// \brief Installs fn as the bf16 GEMM (nullptr: none, so bf16 products are emulated with
/// rounded operands and sgemm) and returns the previous one. For tests, and to rule out a
/// suspect library build. Not synchronized with concurrent GEMM calls.
SbgemmFn set_sbgemm(SbgemmFn fn);

}  // namespace tessera::blas::cblas
