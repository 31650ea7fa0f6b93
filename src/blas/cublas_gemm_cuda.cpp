// cuBLAS GEMM wrapper: plain C++ calling the CUDA runtime and cuBLAS host APIs (no kernels; the
// 16-bit operands of gemm_ex are converted by Kokkos kernels in blas/gemm_precision.cpp).
#include "blas/cublas_gemm.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace tessera::blas::cublas {
namespace {

[[noreturn]] void fail_cublas(cublasStatus_t status, const char* call, const char* file,
                              int line) {
  throw std::runtime_error(std::string("tessera: cuBLAS error ") + cublasGetStatusName(status) +
                           " (" + cublasGetStatusString(status) + ") in " + call + " at " + file +
                           ":" + std::to_string(line));
}

#define TESSERA_CUBLAS_CHECK(call)                                               \
  do {                                                                           \
    const cublasStatus_t tessera_status_ = (call);                               \
    if (tessera_status_ != CUBLAS_STATUS_SUCCESS) {                              \
      fail_cublas(tessera_status_, #call, __FILE__, __LINE__);                   \
    }                                                                            \
  } while (0)

std::mutex handle_mutex;
cublasHandle_t handle_ = nullptr;

/// The process's cuBLAS handle, created on first use.
cublasHandle_t handle() {
  std::lock_guard<std::mutex> lock(handle_mutex);
  if (handle_ == nullptr) {
    if (cuda_device_count() == 0) {
      throw std::runtime_error(
          "tessera: cuBLAS GEMM called but no CUDA device is visible to this process. "
          "---> HINT: run on a GPU node, check CUDA_VISIBLE_DEVICES, or use a host (Serial/OpenMP) "
          "Kokkos build");
    }
    TESSERA_CUBLAS_CHECK(cublasCreate(&handle_));
  }
  return handle_;
}

cublasOperation_t to_cublas(Op op) { return op == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

}  // namespace

int cuda_device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it so a later cudaGetLastError does not report it
    return 0;
  }
  return count;
}

void gemm(void* stream, Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  cublasHandle_t h = handle();
  if (m == 0 || n == 0) return;
  TESSERA_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  TESSERA_CUBLAS_CHECK(cublasSgemm(h, to_cublas(tb), to_cublas(ta), n, m, k, &alpha, B, ldb, A,
                                   lda, &beta, C, ldc));
}

void gemm(void* stream, Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  cublasHandle_t h = handle();
  if (m == 0 || n == 0) return;
  TESSERA_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  TESSERA_CUBLAS_CHECK(cublasDgemm(h, to_cublas(tb), to_cublas(ta), n, m, k, &alpha, B, ldb, A,
                                   lda, &beta, C, ldc));
}

void gemm_ex(void* stream, Precision operands, Op ta, Op tb, int m, int n, int k, float alpha,
             const void* A, int lda, const void* B, int ldb, float beta, float* C, int ldc) {
  if (operands == Precision::fp32) {
    throw std::invalid_argument("tessera::blas::cublas::gemm_ex: operands must be bf16 or fp16");
  }
  const cudaDataType_t type = operands == Precision::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  cublasHandle_t h = handle();
  if (m == 0 || n == 0) return;
  TESSERA_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  TESSERA_CUBLAS_CHECK(cublasGemmEx(h, to_cublas(tb), to_cublas(ta), n, m, k, &alpha, B, type,
                                    ldb, A, type, lda, &beta, C, CUDA_R_32F, ldc,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void release_handle() {
  std::lock_guard<std::mutex> lock(handle_mutex);
  if (handle_ != nullptr) {
    cublasDestroy(handle_);  // teardown: nothing useful to do with a failure here
    handle_ = nullptr;
  }
}

}  // namespace tessera::blas::cublas
