#pragma once
// Float buffers a rank takes and gives back several times a step (a ZeRO-3 bucket's gathered
// values, a ZeRO-2 bucket's working gradients): made once, then reused.
//
// Why not a fresh allocation each time: main.cpp switches glibc's mmap off and keeps freed memory
// (big buffers mapped afresh fault in slowly), so buffers of changing sizes made and freed per
// bucket fragment the heap, and the resident set grows past what the counters hold: at ZeRO 3 by
// about one gathered block (407 MB at the GPT of width 2736, 2026-11-29), which a job's memory
// limit does not see. A pool reuses the smallest free buffer that holds a request, makes a new
// one only while every other is taken, and grows a free one too small (in the first step only:
// the sizes repeat every step). A buffer for a request over half the largest the pool will be
// asked for is made at that largest size, so the blocks' buckets share it; a small request (a tied
// embedding's bucket, held while the blocks' come and go) gets its own size and leaves the large
// buffer to them. The buffers are counted under the pool's category for as long as the pool lives:
// what the memory estimate (train/memory_estimate.cpp) counts, the largest bucket and beside it
// what is held at once.
#include <cstddef>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "kernels/views.hpp"

namespace tessera {

class BufferPool {
 public:
  BufferPool() = default;
  /// `largest`: the most elements one take() will ask for.
  BufferPool(mem::Category category, std::string what, std::size_t largest);

  /// \brief A free buffer of at least n elements, its contents what it last held.
  float* take(std::size_t n);
  /// \brief Gives back a buffer take() returned.
  void give(const float* p);

 private:
  struct Slot {
    Vector<float> buffer;
    bool taken = false;
  };
  void make(Slot& slot, std::size_t n) const;

  mem::Category category_ = mem::Category::param;
  std::string what_;
  std::size_t largest_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace tessera
