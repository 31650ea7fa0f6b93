#pragma once
// Whole-vector reductions and scaling: gradient norm, gradient clipping, finiteness checks.
#include "kernels/math.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// Elements per work item of the blocked reductions below.
inline constexpr Index reduce_block = 256;

/// \brief Sum of x_i^2, accumulated in double.  x (n).
/// Each work item sums one block of reduce_block elements into four independent accumulators,
/// so the loop is not one long dependent chain of adds through the reducer (which made this
/// the slowest kernel of a training step on a CPU backend).
template <class XView>
double sum_squares(const ExecSpace& exec, const XView& x) {
  const Index n = Index(x.extent(0));
  const Index blocks = (n + reduce_block - 1) / reduce_block;
  double result = 0.0;
  Kokkos::parallel_reduce(
      "tessera::sum_squares", range(exec, blocks),
      KOKKOS_LAMBDA(const Index b, double& acc) {
        const Index begin = b * reduce_block;
        const Index end = begin + reduce_block < n ? begin + reduce_block : n;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        Index i = begin;
        for (; i + 4 <= end; i += 4) {
          const double a = double(x(i)), c = double(x(i + 1)), d = double(x(i + 2)),
                       e = double(x(i + 3));
          s0 += a * a;
          s1 += c * c;
          s2 += d * d;
          s3 += e * e;
        }
        for (; i < end; ++i) s0 += double(x(i)) * double(x(i));
        acc += (s0 + s1) + (s2 + s3);
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
