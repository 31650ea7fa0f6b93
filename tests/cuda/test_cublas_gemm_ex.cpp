// cublas::gemm_ex (bf16 / fp16 operands, fp32 C and accumulation) links; without a GPU it
// refuses cleanly; on a GPU it matches a double reference on the 16-bit operands.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "blas/cublas_gemm.hpp"
#include "kernels/precision.hpp"

namespace {

using tessera::Precision;
using tessera::blas::Op;
namespace cublas = tessera::blas::cublas;
namespace k = tessera::kernels;

TEST(CublasGemmEx, Fp32OperandsAreRefused) {
  std::vector<std::uint16_t> a(4), b(4);
  std::vector<float> c(4);
  EXPECT_THROW(cublas::gemm_ex(nullptr, Precision::fp32, Op::N, Op::N, 2, 2, 2, 1.0f, a.data(), 2,
                               b.data(), 2, 0.0f, c.data(), 2),
               std::invalid_argument);
}

TEST(CublasGemmEx, WithoutDeviceThrowsAClearError) {
  if (cublas::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  std::vector<std::uint16_t> a(4), b(4);
  std::vector<float> c(4, 0.0f);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    try {
      cublas::gemm_ex(nullptr, p, Op::N, Op::N, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f,
                      c.data(), 2);
      FAIL() << "gemm_ex did not throw without a device";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(c[0], 0.0f);
}

// On a GPU node: transposes and padded rows against a double loop over the 16-bit values.
TEST(CublasGemmEx, OnDeviceMatchesTheReferenceOnRoundedOperands) {
  if (cublas::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const int m = 9, n = 13, k_ = 70, lda = 12, ldb = 75, ldc = 16;  // A (k,lda): T; B (n,ldb): T
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(tessera::precision_name(p));
    std::vector<std::uint16_t> a(std::size_t(k_) * lda), b(std::size_t(n) * ldb);
    std::vector<float> af(a.size()), bf(b.size()), c(std::size_t(m) * ldc, 0.5f);
    auto encode = [&](float x) {
      return p == Precision::bf16 ? k::to_bf16_bits(x) : k::to_fp16_bits(x);
    };
    auto decode = [&](std::uint16_t h) {
      return p == Precision::bf16 ? k::from_bf16_bits(h) : k::from_fp16_bits(h);
    };
    for (std::size_t i = 0; i < a.size(); ++i)
      af[i] = decode(a[i] = encode(float(std::sin(0.37 * double(i)))));
    for (std::size_t i = 0; i < b.size(); ++i)
      bf[i] = decode(b[i] = encode(float(std::cos(0.11 * double(i)))));
    void *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
    ASSERT_EQ(cudaMalloc(&d_a, a.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_b, b.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_c, c.size() * sizeof(float)), cudaSuccess);
    cudaMemcpy(d_a, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_b, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_c, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice);
    cublas::gemm_ex(nullptr, p, Op::T, Op::T, m, n, k_, 2.0f, d_a, lda, d_b, ldb, -1.0f,
                    static_cast<float*>(d_c), ldc);
    std::vector<float> out(c.size());
    cudaMemcpy(out.data(), d_c, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < ldc; ++j) {
        if (j >= n) {
          EXPECT_EQ(out[i * ldc + j], 0.5f) << "padding written";
          continue;
        }
        double sum = 0.0, mag = 0.0;
        for (int q = 0; q < k_; ++q) {
          const double prod = double(af[q * lda + i]) * double(bf[j * ldb + q]);
          sum += prod;
          mag += std::fabs(prod);
        }
        EXPECT_NEAR(out[i * ldc + j], 2.0 * sum - 0.5,
                    (k_ + 2) * std::ldexp(1.0, -22) * (2.0 * mag + 0.5))
            << i << "," << j;
      }
    }
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_c);
  }
  cublas::release_handle();
}

}  // namespace
