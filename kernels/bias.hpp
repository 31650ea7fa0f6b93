#pragma once
// Bias of a linear layer: broadcast into the rows of the output, and its gradient, the column
// sums of the output gradient.
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief Every row of y becomes b.  b (N), y (B,N).
template <class BView, class YView>
void bias_broadcast(const ExecSpace& exec, const BView& b, const YView& y) {
  const Index n = Index(y.extent(1));
  Kokkos::parallel_for("tessera::bias_broadcast", range(exec, Index(y.extent(0)) * n),
                       KOKKOS_LAMBDA(const Index idx) { y(idx / n, idx % n) = b(idx % n); });
}

/// \brief Adds b to every row of y.  b (N), y (B,N).
template <class BView, class YView>
void bias_add(const ExecSpace& exec, const BView& b, const YView& y) {
  const Index n = Index(y.extent(1));
  Kokkos::parallel_for("tessera::bias_add", range(exec, Index(y.extent(0)) * n),
                       KOKKOS_LAMBDA(const Index idx) { y(idx / n, idx % n) += b(idx % n); });
}

/// \brief db += column sums of dy (accumulates, for micro-batches).  dy (B,N), db (N).
/// One thread per column, a loop over the rows: no atomics, and the summation order is fixed.
template <class DyView, class DbView>
void bias_backward(const ExecSpace& exec, const DyView& dy, const DbView& db) {
  using T = typename DbView::non_const_value_type;
  const Index rows = Index(dy.extent(0));
  Kokkos::parallel_for("tessera::bias_backward", range(exec, Index(dy.extent(1))),
                       KOKKOS_LAMBDA(const Index j) {
                         T sum = T(0);
                         for (Index i = 0; i < rows; ++i) sum += dy(i, j);
                         db(j) += sum;
                       });
}

}  // namespace tessera::kernels
