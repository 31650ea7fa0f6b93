#include "blas/cblas_gemm.hpp"

#include "blas/onednn_gemm.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <atomic>
#include <stdexcept>
#include <string>

namespace tessera::blas::cblas {
namespace {

CBLAS_TRANSPOSE to_cblas(Op op) { return op == Op::N ? CblasNoTrans : CblasTrans; }

/// Row-major leading dimensions must cover the stored row; CBLAS would print and carry on.
void check_ld(const char* what, int ld, int cols) {
  if (ld < (cols > 1 ? cols : 1)) {
    throw std::invalid_argument(std::string("tessera::blas::gemm: ") + what + " = " +
                                std::to_string(ld) + " is less than the stored row width " +
                                std::to_string(cols));
  }
}

}  // namespace

void check_args(Op ta, Op tb, int m, int n, int k, int lda, int ldb, int ldc) {
  if (m < 0 || n < 0 || k < 0) {
    throw std::invalid_argument("tessera::blas::gemm: negative size m=" + std::to_string(m) +
                                " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  check_ld("lda", lda, ta == Op::N ? k : m);
  check_ld("ldb", ldb, tb == Op::N ? n : k);
  check_ld("ldc", ldc, n);
}

namespace {

/// OpenBLAS's cblas_sbgemm, typed by cblas.h's declaration (which it declares whether or not the
/// library exports the symbol); nullptr where it does not.
using LibrarySbgemm = decltype(&cblas_sbgemm);

LibrarySbgemm library_sbgemm() {
  static const LibrarySbgemm fn =
      reinterpret_cast<LibrarySbgemm>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  return fn;
}

void call_library_sbgemm(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A,
                         int lda, const std::uint16_t* B, int ldb, float beta, float* C, int ldc) {
  library_sbgemm()(CblasRowMajor, to_cblas(ta), to_cblas(tb), m, n, k, alpha, A, lda, B, ldb,
                   beta, C, ldc);
}

std::atomic<SbgemmFn>& active_sbgemm() {
  static std::atomic<SbgemmFn> fn{library_sbgemm() != nullptr ? &call_library_sbgemm : nullptr};
  return fn;
}

}  // namespace

SbgemmFn sbgemm() { return active_sbgemm().load(); }

bool is_library_sbgemm(SbgemmFn fn) { return fn != nullptr && fn == &call_library_sbgemm; }

SbgemmFn set_sbgemm(SbgemmFn fn) { return active_sbgemm().exchange(fn); }

void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  check_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), m, n, k, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

void gemm(Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  check_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), m, n, k, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

}  // namespace tessera::blas::cblas

namespace tessera::blas {

void set_threads(int n) {
  if (n < 1) throw std::invalid_argument("tessera::blas::set_threads: n = " + std::to_string(n));
  openblas_set_num_threads(n);
  onednn::set_threads(n);
}

BlasThreading blas_threading() {
  const int parallel = openblas_get_parallel();
  const auto model = parallel == OPENBLAS_OPENMP   ? BlasThreading::Model::openmp
                     : parallel == OPENBLAS_THREAD ? BlasThreading::Model::pthreads
                                                   : BlasThreading::Model::sequential;
  const char* config = openblas_get_config();
  return {config != nullptr ? std::string(config) : std::string("OpenBLAS"), model,
          openblas_get_num_threads()};
}

const char* model_name(BlasThreading::Model m) {
  switch (m) {
    case BlasThreading::Model::sequential: return "sequential";
    case BlasThreading::Model::pthreads: return "own threads";
    case BlasThreading::Model::openmp: return "OpenMP";
  }
  return "?";
}

}  // namespace tessera::blas
