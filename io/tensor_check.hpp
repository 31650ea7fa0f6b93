#pragma once
// What guards a checkpoint tensor's values: a checksum of (logical index, value) pairs that any
// partition of the tensor over ranks sums to the same number, so the ranks that wrote it (each its
// own slab) and the ranks that read it back (in any other layout) can compare it, and a scan for
// values a checkpoint never holds (NaN, infinities). No HDF5 here.
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "io/checkpoint_file.hpp"

namespace tessera::io {

/// \brief The checksum term of the element at logical (row-major) index `index` holding `value`:
/// a 64-bit mix of both, summed modulo 2^64 over the tensor. A changed value or a value moved to
/// another index changes its term, so one damaged element always changes the sum.
inline std::uint64_t element_checksum(std::uint64_t index, float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::uint64_t x = index * 0x9E3779B97F4A7C15ULL + bits;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// What one rank's part of a tensor contributes to its check.
struct TensorCheck {
  std::string path;  ///< "model/layers.0.weight"
  std::uint64_t sum = 0;  ///< element_checksum summed over the part
  /// Logical index of the part's first non-finite value; kNone where all are finite.
  std::uint64_t first_non_finite = kNone;
  static constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();

  /// \brief Adds another part of the same tensor.
  void merge(const TensorCheck& other);
};

/// \brief Calls run(index, values, n) for each run of the slab's elements that lie one after
/// another in the tensor's row-major order (a piece of one row of the last dimension): `index` the
/// logical index of the first, `values` the slab's data for them. In the slab's own order.
void for_each_run(const TensorSlab& slab,
                  const std::function<void(std::uint64_t index, const float* values, std::uint64_t n)>& run);

/// \brief The check of the elements a slab holds (its block or its element range; none for an
/// empty slab), at their logical indices in the slab's full shape.
TensorCheck check_of(const TensorSlab& slab);

}  // namespace tessera::io
