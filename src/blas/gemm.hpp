#pragma once
// Dense matrix products through the vendor BLAS: CBLAS (OpenBLAS) where Tessera's memory space
// is host memory, cuBLAS where it is CUDA memory. The choice is made at compile time from
// tessera::MemSpace; a device Kokkos without the CUDA wrappers is a build error.
#include "blas/op.hpp"
#include "kernels/views.hpp"

namespace tessera::blas {

/// \brief C (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C, all row-major.
/// \param lda, ldb, ldc row strides (elements) of the stored A, B, C: lda >= (ta == N ? k : m).
/// Pointers live in MemSpace memory. beta == 0 overwrites C (NaNs in C are not propagated).
/// The product is enqueued on exec (cuBLAS: exec's stream); host BLAS returns when it is done.
void gemm(const ExecSpace& exec, Op ta, Op tb, int m, int n, int k, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc);
void gemm(const ExecSpace& exec, Op ta, Op tb, int m, int n, int k, double alpha,
          const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc);

/// The same on the default execution-space instance.
void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
void gemm(Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

/// \brief Threads OpenBLAS uses for host GEMM (n >= 1). Set it so that ranks x threads does not
/// exceed the cores of a node.
void set_threads(int n);

}  // namespace tessera::blas
