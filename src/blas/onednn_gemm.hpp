#pragma once
// Host GEMM through oneDNN's matmul primitive (row-major, host pointers). Used by blas/gemm.cpp
// where blas/gemm_library.hpp picks oneDNN for a precision; callable directly for host buffers
// (benchmarks, tests). Free of Kokkos and of oneDNN's headers: a build without oneDNN
// (-DTESSERA_ENABLE_ONEDNN=OFF) links the stubs of onednn_gemm_stub.cpp, whose available() is
// false and whose products throw.
#include <cstddef>
#include <cstdint>
#include <string>

#include "blas/op.hpp"

namespace tessera::blas::onednn {

/// \brief True when this build has oneDNN.
bool available();

/// \brief The instruction set oneDNN dispatches to on this CPU ("avx512_core_bf16",
/// "avx512_core_amx", "avx512_core", "avx2", ...; ONEDNN_MAX_CPU_ISA caps it), or "none" when
/// the build has no oneDNN.
std::string isa();

/// \brief True when that instruction set multiplies bf16 natively (AVX512-BF16's vdpbf16ps or
/// AMX tiles); elsewhere oneDNN's bf16 products are emulated and not faster than fp32.
bool native_bf16();

/// \brief True when oneDNN has a bf16 matmul on this CPU at all (natively or emulated with
/// AVX-512; oneDNN 2.6 has none below AVX-512). Probed once.
bool bf16_supported();

/// \brief C (m x n, fp32) = alpha op(A) op(B) + beta C with fp32 A and B; arguments as
/// cblas::gemm (checked the same way: std::invalid_argument before anything is read).
/// beta == 0 overwrites C. One oneDNN matmul primitive per (shape, strides, transposes, alpha,
/// beta, threads), created at the first call and kept (cache_size()).
void gemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);

/// \brief The same with bf16 A and B (bit patterns, kernels/precision.hpp's to_bf16_bits),
/// products summed in fp32 into the fp32 C: the signature of cblas::SbgemmFn.
void gemm_bf16(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A, int lda,
               const std::uint16_t* B, int ldb, float beta, float* C, int ldc);

/// \brief The products C_oi = alpha op(A_oi) op(B_oi) of a Batch (blas/op.hpp) in one primitive:
/// bf16 A and B, fp32 sums, C stored in bf16 (ties to even) and overwritten; per item the
/// arguments of gemm_bf16 (checked the same way); the batch's counts >= 0.
void gemm_batched_bf16(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A, int lda,
                       const std::uint16_t* B, int ldb, std::uint16_t* C, int ldc, const Batch& batch);

/// \brief C (m x n, bf16, overwritten) = alpha op(A) op(B) + bias with bf16 A and B: the sums in
/// fp32, the bias (fp32, n values, one per column; nullptr: none; only with alpha = 1) added to
/// them, the result rounded to bf16 (ties to even) as it is stored. One 2-D primitive per
/// product, as gemm(). Arguments checked as gemm's; k >= 1 (std::invalid_argument: oneDNN has
/// no empty reduction).
void gemm_bf16_out(Op ta, Op tb, int m, int n, int k, float alpha, const std::uint16_t* A, int lda,
                   const std::uint16_t* B, int ldb, const float* bias, std::uint16_t* C, int ldc);

/// \brief The implementation oneDNN chose for a representative product (1024 x 256 by 256 x
/// 768) in fp32 (bf16 = false) or bf16, e.g. "brg:avx512_core_bf16"; "none" without oneDNN.
std::string implementation(bool bf16);

/// \brief The threads oneDNN's products use from now on (n >= 1): its OpenMP runtime's
/// omp_set_num_threads for the calling thread, looked up at run time. Cached primitives for
/// another count stay cached and are not used meanwhile.
void set_threads(int n);

/// \brief Primitives created so far (one per distinct product); 0 without oneDNN.
std::size_t cache_size();

}  // namespace tessera::blas::onednn
