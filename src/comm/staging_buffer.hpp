#pragma once
// The persistent host buffer of the staged backend: device data is copied into it, reduced by
// MPI there, and copied back. Page-locked (cudaMallocHost) where CUDA can give it, so the copies
// run at full PCIe/NVLink speed and MPI may register it once; ordinary host memory otherwise
// (a build without CUDA, or no device), which serves the same purpose more slowly.
#include <cstddef>
#include <memory>
#include <string>

namespace tessera::comm {

class StagingBuffer {
 public:
  StagingBuffer() = default;
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  /// \brief At least `bytes` bytes, aligned for any scalar. Grows (a new allocation; the old
  /// contents are not kept) only when too small, so a run allocates once per largest buffer.
  void* reserve(std::size_t bytes);

  std::size_t capacity() const { return bytes_; }
  /// True when the memory is page-locked; only meaningful after a reserve.
  bool pinned() const { return pinned_; }
  /// "pinned host memory", or "ordinary host memory (cudaMallocHost: <error>)".
  std::string describe() const;

 private:
  void release();
  void* data_ = nullptr;
  std::unique_ptr<std::byte[]> plain_;  ///< the fallback, when not pinned
  std::size_t bytes_ = 0;
  bool pinned_ = false;
  std::string why_not_pinned_;
};

}  // namespace tessera::comm
