// The staging buffer of the staged backend: grows only when too small, keeps its memory
// otherwise, and says whether it is pinned (in every build, with or without CUDA).
#include <gtest/gtest.h>

#include <cstdint>

#include "comm/device_memory.hpp"
#include "comm/staging_buffer.hpp"

namespace {

using tessera::comm::StagingBuffer;

TEST(StagingBuffer, GrowsOnlyWhenTooSmall) {
  StagingBuffer buf;
  EXPECT_EQ(buf.capacity(), 0u);
  EXPECT_EQ(buf.describe(), "not allocated yet");
  void* a = buf.reserve(100);
  ASSERT_NE(a, nullptr);
  EXPECT_GE(buf.capacity(), 100u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % alignof(double), 0u);
  EXPECT_EQ(buf.reserve(buf.capacity()), a);  // reused
  EXPECT_EQ(buf.reserve(1), a);
  const std::size_t big = buf.capacity() + 1;
  buf.reserve(big);
  EXPECT_GE(buf.capacity(), big);
  // Writable end to end.
  auto* bytes = static_cast<unsigned char*>(buf.reserve(big));
  bytes[0] = 1;
  bytes[big - 1] = 2;
  EXPECT_EQ(bytes[big - 1], 2);
}

TEST(StagingBuffer, PinnedExactlyWhereADeviceExists) {
  StagingBuffer buf;
  buf.reserve(4096);
  EXPECT_EQ(buf.pinned(), tessera::comm::device::count() > 0) << buf.describe();
  EXPECT_NE(buf.describe().find(buf.pinned() ? "pinned host memory" : "ordinary host memory"), std::string::npos)
      << buf.describe();
}

}  // namespace
