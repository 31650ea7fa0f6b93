#pragma once
// Host GEMM through CBLAS (row-major). Used by blas/gemm.hpp when MemSpace is host memory;
// callable directly for host buffers (benchmarks, tests).
#include "blas/gemm.hpp"

namespace tessera::blas::cblas {

void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
void gemm(Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

}  // namespace tessera::blas::cblas
