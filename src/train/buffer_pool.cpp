#include "train/buffer_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace tessera {

BufferPool::BufferPool(mem::Category category, std::string what, std::size_t largest)
    : category_(category), what_(std::move(what)), largest_(largest) {}

void BufferPool::make(Slot& slot, std::size_t n) const {
  slot.buffer = Vector<float>();  // the old one freed before the new one is made
  slot.buffer = Vector<float>(Kokkos::view_alloc(mem::label(category_, what_), Kokkos::WithoutInitializing), n);
}

float* BufferPool::take(std::size_t n) {
  Slot* best = nullptr;   // the smallest free buffer that holds n
  Slot* small = nullptr;  // the largest free one that does not
  for (auto& s : slots_) {
    if (s.taken) continue;
    const std::size_t size = s.buffer.extent(0);
    if (size >= n ? best == nullptr || size < best->buffer.extent(0)
                  : small == nullptr || size > small->buffer.extent(0))
      (size >= n ? best : small) = &s;
  }
  // A buffer made for a request over half the largest is made at the largest size, so that the
  // large requests (the blocks' buckets, of sizes a few elements apart) share it without growing
  // it again; a smaller one at the size asked.
  const std::size_t size = 2 * n > largest_ ? std::max(n, largest_) : n;
  // A small request (a tied embedding's bucket, held while the blocks' buckets come and go) does
  // not take a buffer over twice its size where a smaller free one can grow to it: the large one
  // stays free for the large requests, which would otherwise grow the small buffer to their size
  // and hold two large ones.
  if (small != nullptr && (best == nullptr || best->buffer.extent(0) > 2 * n)) {
    make(*small, size);
    best = small;
  }
  if (best == nullptr) make(*(best = &slots_.emplace_back()), size);
  best->taken = true;
  return best->buffer.data();
}

void BufferPool::give(const float* p) {
  for (auto& s : slots_)
    if (s.taken && s.buffer.data() == p) {
      s.taken = false;
      return;
    }
  throw std::logic_error("tessera::BufferPool::give: not a buffer this pool gave out");
}

}  // namespace tessera
