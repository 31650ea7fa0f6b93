#pragma once
// A grow-only, 64-byte aligned host buffer whose bytes the memory counters see, under the category
// it is made with: the working memory Tessera hands to oneDNN (its primitives' scratchpads, the
// blocked copies its convolutions reorder into; mem::Category::lib, the default), and the buffer a
// checkpoint's or a replica check's reads go through a tensor at a time (io::materialized;
// mem::Category::param), so that summary.json and run.memory_limit_mb count them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "core/memory.hpp"

namespace tessera {

class CountedBuffer {
 public:
  explicit CountedBuffer(mem::Category category = mem::Category::lib) : category_(category) {}
  CountedBuffer(const CountedBuffer&) = delete;
  CountedBuffer& operator=(const CountedBuffer&) = delete;
  ~CountedBuffer() { release(); }

  /// \brief At least `bytes` bytes (their contents are not kept when it grows: the old buffer is
  /// freed before the new one is made); null for 0.
  void* get(std::size_t bytes) {
    if (bytes == 0) return data_.get();
    if (bytes > bytes_) {
      const std::size_t rounded = (bytes + 63) / 64 * 64;
      release();
      data_.reset(std::aligned_alloc(64, rounded));
      if (!data_) throw std::bad_alloc();
      bytes_ = rounded;
      mem::count_external(category_, static_cast<std::int64_t>(bytes_));
    }
    return data_.get();
  }

  std::size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (bytes_ > 0) mem::count_external(category_, -static_cast<std::int64_t>(bytes_));
    data_.reset();
    bytes_ = 0;
  }

  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
  std::size_t bytes_ = 0;
  mem::Category category_;
};

}  // namespace tessera
