// device_memory.hpp for builds without the CUDA wrappers: there is no device, so no pointer is a
// device pointer, pinned memory is unavailable and the copies are plain memcpy.
#include "comm/device_memory.hpp"

#if !defined(TESSERA_HAVE_CUDA_WRAPPERS)
#include <cstring>
#include <stdexcept>

namespace tessera::comm::device {

int count() { return 0; }

std::string current_device_id() { return {}; }

void select(int) { throw std::runtime_error("tessera: no CUDA device in a build without CUDA"); }

bool is_device_pointer(const void*) { return false; }

void* alloc_pinned(std::size_t, std::string& why_not) {
  why_not = "built without CUDA";
  return nullptr;
}

void free_pinned(void*) {}

void* alloc_device(std::size_t) {
  throw std::runtime_error(
      "tessera: device memory requested, but this build has no CUDA. ---> HINT: configure with "
      "-DTESSERA_ENABLE_CUDA=ON on a machine with the CUDA toolkit");
}

void free_device(void*) {}

void copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void synchronize(void*) {}

}  // namespace tessera::comm::device
#endif
