#pragma once
// Whole-vector reductions and scaling: gradient norm, gradient clipping, finiteness checks.
#include "kernels/math.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief Sum of x_i^2, accumulated in double.  x (n).
template <class XView>
double sum_squares(const ExecSpace& exec, const XView& x) {
  double result = 0.0;
  Kokkos::parallel_reduce(
      "tessera::sum_squares", range(exec, Index(x.extent(0))),
      KOKKOS_LAMBDA(const Index i, double& acc) { acc += double(x(i)) * double(x(i)); }, result);
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
