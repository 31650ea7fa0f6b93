// The CUDA wrappers link, and on a machine without a GPU they report it cleanly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include <stdexcept>
#include <string>
#include <vector>

#include "blas/cublas_gemm.hpp"
#include "comm/device_memory.hpp"
#include "comm/staging_buffer.hpp"
#if defined(TESSERA_HAVE_NCCL)
#include "comm/nccl_comm.hpp"
#endif

namespace {

using tessera::blas::Op;
namespace cublas = tessera::blas::cublas;

TEST(CudaLink, DeviceCountIsNeverNegative) { EXPECT_GE(cublas::cuda_device_count(), 0); }

TEST(CudaLink, GemmWithoutDeviceThrowsAClearError) {
  if (cublas::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, 0.0f);
  try {
    cublas::gemm(nullptr, Op::N, Op::N, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
    FAIL() << "cuBLAS gemm did not throw without a device";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  // Nothing was written through the (host) pointers.
  EXPECT_EQ(c[0], 0.0f);
}

// On a GPU node: a row-major product with transposes and padded rows against a host loop.
TEST(CudaLink, GemmOnDeviceMatchesHostLoop) {
  if (cublas::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const int m = 3, n = 5, k = 4, lda = 6, ldb = 7, ldc = 8;  // A stored (k,lda): Op::T
  std::vector<double> a(k * lda), b(k * ldb), c(m * ldc, 1.0);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.3 * double(i));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.7 * double(i));
  double *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
  ASSERT_EQ(cudaMalloc(&d_a, a.size() * sizeof(double)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_b, b.size() * sizeof(double)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_c, c.size() * sizeof(double)), cudaSuccess);
  cudaMemcpy(d_a, a.data(), a.size() * sizeof(double), cudaMemcpyHostToDevice);
  cudaMemcpy(d_b, b.data(), b.size() * sizeof(double), cudaMemcpyHostToDevice);
  cudaMemcpy(d_c, c.data(), c.size() * sizeof(double), cudaMemcpyHostToDevice);
  cublas::gemm(nullptr, Op::T, Op::N, m, n, k, 2.0, d_a, lda, d_b, ldb, 0.5, d_c, ldc);
  std::vector<double> out(c.size());
  cudaMemcpy(out.data(), d_c, c.size() * sizeof(double), cudaMemcpyDeviceToHost);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int p = 0; p < k; ++p) sum += a[p * lda + i] * b[p * ldb + j];
      EXPECT_NEAR(out[i * ldc + j], 2.0 * sum + 0.5, 1e-12) << i << "," << j;
    }
  }
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_c);
  cublas::release_handle();
}

namespace device = tessera::comm::device;

TEST(CudaLink, DeviceMemoryAgreesWithCublasOnTheDeviceCount) {
  EXPECT_EQ(device::count(), cublas::cuda_device_count());
  int on_stack = 0;
  EXPECT_FALSE(device::is_device_pointer(&on_stack));
  EXPECT_FALSE(device::is_device_pointer(nullptr));
}

TEST(CudaLink, WithoutDevicePinnedMemoryFallsBackAndDeviceMemoryThrows) {
  if (device::count() > 0) GTEST_SKIP() << "a CUDA device is present";
  std::string why;
  EXPECT_EQ(device::alloc_pinned(4096, why), nullptr);
  EXPECT_NE(why.find("cudaMallocHost"), std::string::npos) << why;
  EXPECT_THROW(device::alloc_device(4096), std::runtime_error);
  tessera::comm::StagingBuffer buf;
  ASSERT_NE(buf.reserve(1000), nullptr);
  EXPECT_FALSE(buf.pinned());
  EXPECT_NE(buf.describe().find("ordinary host memory"), std::string::npos) << buf.describe();
}

// On a GPU node: the staging buffer is pinned, and a round trip through device memory holds.
TEST(CudaLink, PinnedStagingAndDeviceCopiesOnDevice) {
  if (device::count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  tessera::comm::StagingBuffer buf;
  auto* host = static_cast<float*>(buf.reserve(1024 * sizeof(float)));
  EXPECT_TRUE(buf.pinned()) << buf.describe();
  for (int i = 0; i < 1024; ++i) host[i] = static_cast<float>(i);
  void* d = device::alloc_device(1024 * sizeof(float));
  EXPECT_TRUE(device::is_device_pointer(d));
  EXPECT_FALSE(device::is_device_pointer(host));
  device::copy(d, host, 1024 * sizeof(float));
  std::vector<float> back(1024);
  device::copy(back.data(), d, 1024 * sizeof(float));
  device::free_device(d);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(back[i], static_cast<float>(i));
}

#if defined(TESSERA_HAVE_NCCL)
TEST(CudaLink, NcclWithoutDeviceThrowsOnEveryRank) {
  if (cublas::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(tessera::comm::NcclComm comm(MPI_COMM_WORLD), std::runtime_error);
}
#endif

}  // namespace
