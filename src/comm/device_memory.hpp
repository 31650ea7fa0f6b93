#pragma once
// The few CUDA runtime calls the communicator needs, behind a header that names no CUDA type.
// device_memory_cuda.cpp implements them with the CUDA runtime (built into tessera_cuda when
// TESSERA_ENABLE_CUDA is on); device_memory_host.cpp stands in otherwise, where no device
// pointer can exist.
#include <cstddef>
#include <string>

namespace tessera::comm::device {

/// \brief CUDA devices visible to this process; 0 (not an error) without CUDA, driver or device.
int count();

/// \brief The PCI bus id of this thread's current device ("0000:18:00.0"), the same string in
/// every process that runs on that device; empty where count() is 0.
std::string current_device_id();

/// \brief Makes `device` (0 <= device < count()) current for this thread. A CUDA Kokkos picks
/// the device itself; this is for code that runs without one (tests, tools).
void select(int device);

/// \brief True when p points into CUDA device or managed memory; false for host memory, and
/// always where count() is 0.
bool is_device_pointer(const void* p);

/// \brief `bytes` of page-locked host memory (cudaMallocHost), or nullptr where none can be had
/// (built without CUDA, no driver, no device); then `why_not` says why and the caller uses
/// ordinary host memory. Free with free_pinned.
void* alloc_pinned(std::size_t bytes, std::string& why_not);
void free_pinned(void* p);

/// \brief `bytes` of device memory (cudaMalloc). Throws std::runtime_error where there is no
/// device. Free with free_device.
void* alloc_device(std::size_t bytes);
void free_device(void* p);

/// \brief Copies `bytes` between host and device memory in either direction, synchronously
/// (cudaMemcpyDefault: the runtime tells them apart). Work that produces `src` must be finished.
/// Throws std::runtime_error naming the CUDA error.
void copy(void* dst, const void* src, std::size_t bytes);

/// \brief Waits for the work enqueued on `stream` (a cudaStream_t; nullptr: the default stream).
void synchronize(void* stream);

}  // namespace tessera::comm::device
