#include "io/tensor_check.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tessera::io {

void TensorCheck::merge(const TensorCheck& other) {
  sum += other.sum;
  first_non_finite = std::min(first_non_finite, other.first_non_finite);
}

void for_each_run(const TensorSlab& slab,
                  const std::function<void(std::uint64_t index, const float* values, std::uint64_t n)>& run) {
  const std::size_t rank = slab.shape.size();
  std::uint64_t block = 1;
  for (std::uint64_t c : slab.count) block *= c;
  const std::uint64_t first = slab.by_elements ? slab.first : 0;
  const std::uint64_t last = slab.by_elements ? slab.last : block;
  if (rank == 0 || first >= last || slab.data == nullptr) return;

  // Walk the block's elements [first, last) in row-major order, a run along the last dimension
  // at a time: position p of the block is logical index sum_d (offset[d] + i_d) * stride[d].
  std::vector<std::uint64_t> stride(rank, 1);
  for (std::size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * slab.shape[d];
  std::vector<std::uint64_t> at(rank);  // the block index of position p
  std::uint64_t rest = first;
  for (std::size_t d = rank; d-- > 0;) {
    at[d] = rest % slab.count[d];
    rest /= slab.count[d];
  }
  const float* value = slab.data;
  for (std::uint64_t p = first; p < last;) {
    std::uint64_t base = 0;
    for (std::size_t d = 0; d < rank; ++d) base += (slab.offset[d] + at[d]) * stride[d];
    const std::uint64_t n = std::min(slab.count[rank - 1] - at[rank - 1], last - p);
    run(base, value, n);
    value += n;
    p += n;
    // Advance the block index by n: the last dimension wraps to the next row.
    at[rank - 1] += n;
    for (std::size_t d = rank - 1; d > 0 && at[d] == slab.count[d]; --d) {
      at[d] = 0;
      ++at[d - 1];
    }
  }
}

TensorCheck check_of(const TensorSlab& slab) {
  TensorCheck check;
  check.path = slab.path;
  CountedBuffer buffer(mem::Category::param);  // a slab with a fill: its elements
  for_each_run(materialized(slab, buffer), [&](std::uint64_t base, const float* value, std::uint64_t n) {
    for (std::uint64_t j = 0; j < n; ++j) {
      check.sum += element_checksum(base + j, value[j]);
      if (!std::isfinite(value[j]) && check.first_non_finite == TensorCheck::kNone)
        check.first_non_finite = base + j;
    }
  });
  return check;
}

}  // namespace tessera::io
