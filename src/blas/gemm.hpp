#pragma once
// Dense matrix products through the vendor BLAS: CBLAS (OpenBLAS) where Tessera's memory space
// is host memory, cuBLAS where it is CUDA memory. The choice is made at compile time from
// tessera::MemSpace; a device Kokkos without the CUDA wrappers is a build error.
#include <cstdint>
#include <string>

#include "blas/op.hpp"
#include "core/precision.hpp"
#include "kernels/views.hpp"

namespace tessera::blas {

/// \brief C (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C, all row-major.
/// \param lda, ldb, ldc row strides (elements) of the stored A, B, C: lda >= (ta == N ? k : m).
/// Pointers live in MemSpace memory. beta == 0 overwrites C (NaNs in C are not propagated).
/// The product is enqueued on exec (cuBLAS: exec's stream); host BLAS returns when it is done.
/// The float gemm computes in fp32; a layer's products go through matmul below, in the precision
/// the layer was built with.
void gemm(const ExecSpace& exec, Op ta, Op tb, int m, int n, int k, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc);
void gemm(const ExecSpace& exec, Op ta, Op tb, int m, int n, int k, double alpha,
          const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc);

/// The same on the default execution-space instance.
void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);
void gemm(Op ta, Op tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

/// \brief Mixed precision (blas/gemm_precision.cpp): C = alpha op(rp(A)) op(rp(B)) + beta C,
/// where rp rounds each element of A and B to precision p (ties to even, kernels/precision.hpp)
/// and the products are summed in fp32 into the fp32 C; A and B themselves are not modified.
/// fp32 is the float gemm above. bf16 and fp16 convert A and B into grow-only scratch (kept
/// for the next call, released at Kokkos::finalize) and run, by lowp_path(p):
///   host: cblas_sbgemm on bf16 copies where OpenBLAS exports it (bf16), else sgemm on copies
///         rounded to p ("emulated": the numerics of a 16-bit GEMM with fp32 accumulation,
///         since products of bf16 or fp16 values are exact in fp32; fp32 speed);
///   CUDA: cublasGemmEx on bf16 / fp16 copies, CUBLAS_COMPUTE_32F.
/// Arguments as for the float gemm (checked before anything is read). Enqueued on exec; the
/// host paths return when C is written. Calls are serialized within a process (one scratch).
void gemm(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

/// The same on the default execution-space instance.
void gemm(Precision p, Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

/// \brief How gemm(exec, p, ...) computes in this build and process, for the run log:
/// "cblas_sgemm", "cblas_sbgemm", "emulated (rounded operands, sgemm)", "cublasSgemm",
/// "cublasGemmEx (CUDA_R_16BF, CUBLAS_COMPUTE_32F)", "cublasGemmEx (CUDA_R_16F, ...)", or
/// "bf16 GEMM installed by cblas::set_sbgemm".
const char* lowp_path(Precision p);

/// \brief A layer's matrix product in precision p, which whoever builds the layer decides once
/// (train.precision, passed down in the network's Part): C = alpha op(A) op(B) + beta C, for fp32
/// the float gemm above; for bf16 and fp16 gemm(exec, p, ...) with C then rounded to p (rows of n
/// at stride ldc), so the product is stored in p as a 16-bit GEMM's output would be (fp16
/// overflows to inf beyond 65504). Arguments and checks as the float gemm's.
void matmul(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
            const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
/// \brief The same for a double layer (the double models of the gradient checks): the double
/// gemm. p is the precision of float layers and does not apply, so a layer templated on its
/// element type names its precision at every product all the same.
void matmul(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, double alpha,
            const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc);

/// \brief An operand of the products below: fp32 values (f32), rounded to bf16 as the product
/// reads them, or values that are bf16 already (bf16: bit patterns, kernels/precision.hpp), stored
/// as the float gemm's A or B would be, at row stride ld. Exactly one of the pointers is set.
struct Operand {
  const float* f32 = nullptr;
  const std::uint16_t* bf16 = nullptr;
  int ld = 0;
};

/// \brief True where matmul(exec, p, ...) multiplies bf16 operands as they are: p is bf16 and
/// the host runs a real bf16 GEMM (oneDNN's matmul or cblas_sbgemm), so an operand kept in bf16
/// by its producer (a weight's copy, an activation written in bf16) saves the packing and gives
/// the same bits. False for fp32 and fp16, for the emulated bf16 path, on CUDA (which keep
/// packing fp32 operands) and under the test hook test_hooks::pack_bf16().
bool bf16_operands(Precision p);

/// \brief matmul(exec, p, ...) (under bf16: operands rounded to bf16, fp32 accumulation, C
/// rounded to bf16) with operands that may be bf16 already: those are read as they are, fp32 ones
/// are packed into bf16 scratch as gemm(exec, p, ...) packs them; the same bits as matmul on the
/// fp32 values of the bf16 ones. Needs bf16_operands(p) (else std::logic_error); arguments
/// checked as the float gemm's (lda = A.ld, ldb = B.ld).
void matmul(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
            const Operand& A, const Operand& B, float beta, float* C, int ldc);

/// \brief The same product (beta = 0) with C stored in bf16 (bit patterns, ties to even;
/// overwritten): what matmul under bf16 stores, for a consumer that reads bf16 (the GPT's
/// activations and logits), in half the bytes and without a pass of its own to round.
/// bias (n fp32 values, one per column; only with alpha = 1, else std::invalid_argument) is added
/// to the fp32 sums before they are rounded, as a layer's bias in the same product. oneDNN does
/// both as it stores C; another bf16 GEMM sums into fp32 scratch first. Needs bf16_operands(p).
void matmul(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
            const Operand& A, const Operand& B, std::uint16_t* C, int ldc, const float* bias = nullptr);

/// \brief The products C_oi = alpha op(A_oi) op(B_oi) of a Batch (blas/op.hpp: two nested
/// indices, each operand's strides) on bf16 operands, summed in fp32 and stored in bf16 (ties to
/// even; C overwritten): what matmul under bf16 computes and rounds, item by item, in one call
/// where oneDNN multiplies (one primitive for the batch: the attention's per-head products), else
/// one bf16 GEMM per item. Needs bf16_operands(p) (else std::logic_error); per item the float
/// gemm's arguments and checks; counts >= 0 (std::invalid_argument).
void matmul_batched(const ExecSpace& exec, Precision p, Op ta, Op tb, int m, int n, int k, float alpha,
                    const std::uint16_t* A, int lda, const std::uint16_t* B, int ldb, std::uint16_t* C, int ldc,
                    const Batch& batch);

/// \brief Threads OpenBLAS and oneDNN use for host GEMM (n >= 1). Set it so that ranks x threads
/// does not exceed the cores of a node.
void set_threads(int n);

/// How the linked BLAS runs its threads, as OpenBLAS reports it.
struct BlasThreading {
  enum class Model { sequential, pthreads, openmp };
  std::string config;  ///< openblas_get_config(): version, target, build options
  Model model;         ///< openblas_get_parallel(): its own thread pool or OpenMP's
  int threads;         ///< openblas_get_num_threads()
};
BlasThreading blas_threading();
const char* model_name(BlasThreading::Model m);

}  // namespace tessera::blas
