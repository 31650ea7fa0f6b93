// The CUDA wrappers link, and on a machine without a GPU they report it cleanly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
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

// The NVIDIA GPUs this process could open: the driver's device nodes /dev/nvidia0, /dev/nvidia1,
// ... (a container gets the nodes of its GPUs only; /proc/driver/nvidia lists the host's GPUs
// even where none is passed in, so it does not tell).
int nvidia_device_nodes() {
  int nodes = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.compare(0, 6, "nvidia") == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos)
      ++nodes;
  }
  return nodes;
}

// What blas/cublas_gemm.hpp promises: the number of devices the runtime shows this process, and
// 0, not an error, where there is no driver or no device. And that number is the machine's.
TEST(CudaLink, DeviceCountIsWhatTheMachineHas) {
  const int count = cublas::cuda_device_count();
  const cudaError_t left = cudaGetLastError();  // what the wrapper left for a later check

  int raw = -1;
  const cudaError_t status = cudaGetDeviceCount(&raw);
  (void)cudaGetLastError();
  const int nodes = nvidia_device_nodes();
  const std::string said = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + ", count " +
                           std::to_string(raw) + "; left by the wrapper: " + cudaGetErrorName(left) +
                           "; /dev/nvidiaN device nodes: " + std::to_string(nodes);
  EXPECT_EQ(count, status == cudaSuccess ? raw : 0) << said;
  if (status == cudaSuccess || status == cudaErrorNoDevice) {
    // The runtime started: the wrapper cleared any failure, so a later cudaGetLastError is clean.
    EXPECT_EQ(left, cudaSuccess) << said;
  } else {
    // No usable driver (none, one too old for this runtime, or the toolkit's stub libcuda): every
    // runtime call, cudaGetLastError too, answers that status; nothing can clear it.
    EXPECT_TRUE(status == cudaErrorInsufficientDriver || status == cudaErrorStubLibrary) << said;
    EXPECT_EQ(left, status) << said;
  }
  // No device node (and no WSL GPU, /dev/dxg): no device. Device nodes and no CUDA_VISIBLE_DEVICES
  // to hide them: at least one (a MIG-partitioned GPU may show fewer or more, so no exact number).
  if (nodes == 0 && !std::filesystem::exists("/dev/dxg")) {
    EXPECT_EQ(count, 0) << said;
  }
  if (nodes > 0 && std::getenv("CUDA_VISIBLE_DEVICES") == nullptr) {
    EXPECT_GT(count, 0) << said;
  }
}

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
