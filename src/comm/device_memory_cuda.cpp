// device_memory.hpp on the CUDA runtime: plain C++ calling the runtime's host API (no kernels).
#include "comm/device_memory.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tessera::comm::device {
namespace {

[[noreturn]] void fail_cuda(cudaError_t err, const char* call, const char* file, int line) {
  std::string text = "tessera: CUDA error '";
  text += cudaGetErrorString(err);
  text += "' in ";
  text += call;
  text += " at ";
  text += file;
  text += ':';
  text += std::to_string(line);
  throw std::runtime_error(text);
}

#define TESSERA_CUDA_CHECK(call)                                                     \
  do {                                                                               \
    const cudaError_t tessera_err_ = (call);                                         \
    if (tessera_err_ != cudaSuccess) fail_cuda(tessera_err_, #call, __FILE__, __LINE__); \
  } while (0)

}  // namespace

int count() {
  // Asked once: the answer does not change while the process runs.
  static const int devices = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // clear it so a later cudaGetLastError does not report it
      return 0;
    }
    return n;
  }();
  return devices;
}

std::string current_device_id() {
  if (count() == 0) return {};
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  char bus[32] = {};
  TESSERA_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), device));
  return bus;
}

void select(int device) { TESSERA_CUDA_CHECK(cudaSetDevice(device)); }

bool is_device_pointer(const void* p) {
  if (p == nullptr || count() == 0) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

void* alloc_pinned(std::size_t bytes, std::string& why_not) {
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    why_not = "cudaMallocHost: ";
    why_not += cudaGetErrorString(err);
    return nullptr;
  }
  return p;
}

void free_pinned(void* p) {
  if (p != nullptr) (void)cudaFreeHost(p);  // teardown: nothing useful to do with a failure
}

void* alloc_device(std::size_t bytes) {
  if (count() == 0)
    throw std::runtime_error("tessera: device memory requested, but no CUDA device is visible to "
                             "this process. ---> HINT: check CUDA_VISIBLE_DEVICES");
  void* p = nullptr;
  TESSERA_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void free_device(void* p) {
  if (p != nullptr) (void)cudaFree(p);
}

void copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) TESSERA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void synchronize(void* stream) {
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace tessera::comm::device
