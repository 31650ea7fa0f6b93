#include "comm/staging_buffer.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "comm/device_memory.hpp"

namespace tessera::comm {

StagingBuffer::~StagingBuffer() { release(); }

void StagingBuffer::release() {
  if (pinned_) device::free_pinned(data_);
  plain_.reset();
  data_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

void* StagingBuffer::reserve(std::size_t bytes) {
  if (bytes <= bytes_ && data_ != nullptr) return data_;
  release();
  // Round up to whole MiB so that slowly growing requests do not reallocate every time.
  constexpr std::size_t mib = std::size_t{1} << 20;
  const std::size_t want = (std::max<std::size_t>(bytes, 1) + mib - 1) / mib * mib;
  why_not_pinned_.clear();
  data_ = device::alloc_pinned(want, why_not_pinned_);
  pinned_ = data_ != nullptr;
  if (!pinned_) {
    plain_ = std::make_unique<std::byte[]>(want);
    data_ = plain_.get();
  }
  bytes_ = want;
  return data_;
}

std::string StagingBuffer::describe() const {
  if (data_ == nullptr) return "not allocated yet";
  return pinned_ ? std::string("pinned host memory")
                 : fmt::format("ordinary host memory ({})", why_not_pinned_);
}

}  // namespace tessera::comm
