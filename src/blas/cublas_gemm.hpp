#pragma once
// GEMM on CUDA memory through cuBLAS, and the CUDA device count. Built into tessera_cuda only
// when TESSERA_ENABLE_CUDA is on. This header names no CUDA type (a stream is a void*), so
// translation units compiled without the CUDA include paths can declare calls into it.
#include "blas/op.hpp"
#include "core/precision.hpp"

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

/// \brief Row-major C (m x n, fp32) = alpha op(A) op(B) + beta C with 16-bit A and B on
/// `stream`: cublasGemmEx with CUDA_R_16BF (operands == bf16) or CUDA_R_16F (fp16) A and B,
/// CUDA_R_32F C and CUBLAS_COMPUTE_32F (fp32 accumulation; tensor cores where the shapes allow).
/// A and B are device arrays of bf16 / binary16 bit patterns (kernels/precision.hpp's
/// to_bf16_bits / to_fp16_bits). Throws std::invalid_argument for operands == fp32, and what
/// gemm throws otherwise.
void gemm_ex(void* stream, Precision operands, Op ta, Op tb, int m, int n, int k, float alpha,
             const void* A, int lda, const void* B, int ldb, float beta, float* C, int ldc);

/// \brief Destroys the lazily created cuBLAS handle (call before the CUDA context goes away,
/// e.g. before Kokkos::finalize). A later gemm creates a new one.
void release_handle();

}  // namespace tessera::blas::cublas
