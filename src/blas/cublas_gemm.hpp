#pragma once
// GEMM on CUDA memory through cuBLAS, and the CUDA device count. Built into tessera_cuda only
// when TESSERA_ENABLE_CUDA is on. This header names no CUDA type (a stream is a void*), so
// translation units compiled without the CUDA include paths can declare calls into it.
#include "blas/op.hpp"

namespace tessera::blas::cublas {

/// \brief Number of CUDA devices visible to this process; 0 (not an error) when there is no
/// driver or no device, so a CUDA-enabled build still runs on a CPU-only node.
int cuda_device_count();

/// \brief Row-major C (m x n) = alpha op(A) op(B) + beta C on `stream` (a cudaStream_t; nullptr
/// is the default stream), computed as the column-major C^T = op(B)^T op(A)^T.
/// A, B, C are device pointers. Throws std::runtime_error naming the cuBLAS status on failure,
/// and before touching any pointer when no CUDA device is visible.
void gemm(void* stream, Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm(void* stream, Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

/// \brief Destroys the lazily created cuBLAS handle (call before the CUDA context goes away,
/// e.g. before Kokkos::finalize). A later gemm creates a new one.
void release_handle();

}  // namespace tessera::blas::cublas
