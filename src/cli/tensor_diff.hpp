#pragma once
// What `tessera diff` measures for one tensor in two checkpoints: the largest absolute difference
// and the largest magnitude, accumulated slab by slab and merged across ranks. Pure; no I/O.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace tessera::cli {

/// \brief max |a_i - b_i| and max(|a_i|, |b_i|) over the elements of two same-shaped tensors seen
/// so far. NaN in both at the same place, or the same infinity in both, counts as equal; NaN on
/// one side only, or an infinity against anything else, is an infinite difference. The scale
/// counts finite elements only. Neither field is ever NaN, so a max-reduction over ranks is exact.
struct TensorDiff {
  double max_abs = 0.0;    ///< max_i |a_i - b_i|
  double max_scale = 0.0;  ///< max_i max(|a_i|, |b_i|) over finite values

  /// \brief Adds n elements. a (n), b (n).
  void add(const float* a, const float* b, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const double x = a[i], y = b[i];
      double d = 0.0;
      if (x != y && !(std::isnan(x) && std::isnan(y))) {
        d = std::abs(x - y);
        if (std::isnan(d)) d = std::numeric_limits<double>::infinity();  // NaN or inf - inf
      }
      max_abs = std::max(max_abs, d);
      if (std::isfinite(x)) max_scale = std::max(max_scale, std::abs(x));
      if (std::isfinite(y)) max_scale = std::max(max_scale, std::abs(y));
    }
  }

  /// \brief The relative difference of the tensor as a whole:
  /// max_abs / max(max_scale, FLT_MIN). 0 when the tensors are equal (two all-zero tensors
  /// included), infinite when max_abs is.
  double max_rel() const {
    if (max_abs == 0.0) return 0.0;
    return max_abs / std::max(max_scale, static_cast<double>(std::numeric_limits<float>::min()));
  }
};

}  // namespace tessera::cli
