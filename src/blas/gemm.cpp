// Compile-time dispatch of tessera::blas::gemm on the memory space Kokkos was built for.
#include "blas/gemm.hpp"

#include <type_traits>

#include "blas/cblas_gemm.hpp"
#include "blas/gemm_library.hpp"
#include "blas/onednn_gemm.hpp"
#include "kernels/precision.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#if !defined(TESSERA_HAVE_CUDA_WRAPPERS)
#error "Kokkos has the CUDA backend but Tessera was configured without its cuBLAS wrappers. ---> HINT: configure with -DTESSERA_ENABLE_CUDA=ON"
#endif
#include "blas/cublas_gemm.hpp"
#define TESSERA_GEMM_CUBLAS 1
#else
static_assert(std::is_same_v<tessera::MemSpace, Kokkos::HostSpace>,
              "tessera::blas::gemm has no backend for this Kokkos memory space: only HostSpace "
              "(CBLAS) and CudaSpace (cuBLAS) are supported");
#endif

namespace tessera::blas {
namespace {

template <class T>
void gemm_dispatch(const ExecSpace& exec, Op ta, Op tb, int m, int n, int k, T alpha, const T* A,
                   int lda, const T* B, int ldb, T beta, T* C, int ldc) {
#if defined(TESSERA_GEMM_CUBLAS)
  cublas::gemm(exec.cuda_stream(), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  // Kernels enqueued on exec before this call must have finished (a no-op for Serial).
  exec.fence();
  if constexpr (std::is_same_v<T, float>) {
    if (library_for(Precision::fp32) == Library::onednn) {
      onednn::gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
  }
  cblas::gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

}  // namespace

void gemm(const ExecSpace& exec, Op ta, Op tb, int m, int n, int k, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  gemm_dispatch(exec, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
            const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (p == Precision::fp32) {
    gemm_dispatch(exec, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  gemm(exec, p, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  // The product is stored in p: round C (rows of n at stride ldc).
  kernels::round_rows(exec, p, C, m, n, ldc);
}

void matmul(const ExecSpace& exec, Precision /*p: float layers only*/, Op ta, Op tb, int m, int n, int k,
            double alpha, const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  gemm_dispatch(exec, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(const ExecSpace& exec, Op ta, Op tb, int m, int n, int k, double alpha,
          const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  gemm_dispatch(exec, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  gemm(ExecSpace(), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  gemm(ExecSpace(), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace tessera::blas
