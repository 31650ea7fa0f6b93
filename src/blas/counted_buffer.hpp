#pragma once
// A grow-only, 64-byte aligned host buffer whose bytes the memory counters see (mem::Category::lib):
// the working memory Tessera hands to oneDNN (its primitives' scratchpads, the blocked copies
// its convolutions reorder into), so that summary.json and run.memory_limit_mb count it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "core/memory.hpp"

namespace tessera::blas {

class CountedBuffer {
 public:
  CountedBuffer() = default;
  CountedBuffer(const CountedBuffer&) = delete;
  CountedBuffer& operator=(const CountedBuffer&) = delete;
  ~CountedBuffer() { release(); }

  /// \brief At least `bytes` bytes (their contents are not kept when it grows); null for 0.
  void* get(std::size_t bytes) {
    if (bytes == 0) return data_.get();
    if (bytes > bytes_) {
      const std::size_t rounded = (bytes + 63) / 64 * 64;
      release();
      data_.reset(std::aligned_alloc(64, rounded));
      if (!data_) throw std::bad_alloc();
      bytes_ = rounded;
      mem::count_external(mem::Category::lib, static_cast<std::int64_t>(bytes_));
    }
    return data_.get();
  }

  std::size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (bytes_ > 0) mem::count_external(mem::Category::lib, -static_cast<std::int64_t>(bytes_));
    data_.reset();
    bytes_ = 0;
  }

  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
  std::size_t bytes_ = 0;
};

}  // namespace tessera::blas
