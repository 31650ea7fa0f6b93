#pragma once
// Whole-vector reductions and scaling: gradient norm, gradient clipping, finiteness checks.
#include "kernels/math.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// Elements per work item of the blocked reductions below.
inline constexpr Index reduce_block = 256;

/// Independent double accumulators per work item of sum_squares: sixteen, two AVX-512 vectors of
/// doubles (the compiler vectorises the fixed inner loop), so the adds do not wait on each other.
inline constexpr int sum_squares_lanes = 16;

/// \brief Sum of x_i^2, accumulated in double.  x (n).
/// Each work item sums one block of reduce_block elements into sum_squares_lanes accumulators
/// (element i of the block into lane i mod 16, the tail into lane 0), added up in a fixed tree,
/// so the loop is not one long dependent chain of adds through the reducer (which made this the
/// slowest kernel of a training step on a CPU backend). The result depends only on x and n.
template <class XView>
double sum_squares(const ExecSpace& exec, const XView& x) {
  const Index n = Index(x.extent(0));
  const Index blocks = (n + reduce_block - 1) / reduce_block;
  double result = 0.0;
  Kokkos::parallel_reduce(
      "tessera::sum_squares", range(exec, blocks),
      KOKKOS_LAMBDA(const Index b, double& acc) {
        constexpr int lanes = sum_squares_lanes;
        const Index begin = b * reduce_block;
        const Index end = begin + reduce_block < n ? begin + reduce_block : n;
        double s[lanes] = {};
        Index i = begin;
        for (; i + lanes <= end; i += lanes)
          for (int j = 0; j < lanes; ++j) {
            const double v = double(x(i + j));
            s[j] += v * v;
          }
        for (; i < end; ++i) s[0] += double(x(i)) * double(x(i));
        for (int width = lanes / 2; width >= 1; width /= 2)
          for (int j = 0; j < width; ++j) s[j] += s[j + width];
        acc += s[0];
      },
      result);
  return result;
}

/// \brief x *= alpha in place.  x (n).
template <class XView>
void scale(const ExecSpace& exec, const XView& x, typename XView::non_const_value_type alpha) {
  Kokkos::parallel_for("tessera::scale", range(exec, Index(x.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { x(i) *= alpha; });
}

/// \brief True when no element of x is NaN or infinite.  x (n).
template <class XView>
bool all_finite(const ExecSpace& exec, const XView& x) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "tessera::all_finite", range(exec, Index(x.extent(0))),
      KOKKOS_LAMBDA(const Index i, std::int64_t& acc) { acc += math::isfinite(x(i)) ? 0 : 1; },
      bad);
  return bad == 0;
}

}  // namespace tessera::kernels
