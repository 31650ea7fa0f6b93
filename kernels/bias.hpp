#pragma once
// Bias of a linear layer: broadcast into the rows of the output, and its gradient, the column
// sums of the output gradient.
#include "kernels/simd.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// 2-D policy over (rows, cols) of y: no integer division per element (a flat range with
/// idx / N, idx % N measured slower on the host), coalesced over columns on GPUs.
template <class YView>
Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>> rows_cols(
    const ExecSpace& exec, const YView& y) {
  return Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>(
      exec, {0, 0}, {Index(y.extent(0)), Index(y.extent(1))});
}

/// Host memory: one thread per row with a vectorisable loop over the columns (an MDRange tiles
/// and does not vectorise); a GPU: one thread per element.
template <class YView>
constexpr bool rows_on_host() {
  return Kokkos::SpaceAccessibility<HostSpace, typename YView::memory_space>::accessible;
}

/// \brief Every row of y becomes b.  b (N), y (B,N).
template <class BView, class YView>
void bias_broadcast(const ExecSpace& exec, const BView& b, const YView& y) {
  if constexpr (rows_on_host<YView>()) {
    const Index cols = Index(y.extent(1));
    Kokkos::parallel_for("tessera::bias_broadcast", range(exec, Index(y.extent(0))), KOKKOS_LAMBDA(const Index i) {
      TESSERA_SIMD
      for (Index j = 0; j < cols; ++j) y(i, j) = b(j);
    });
  } else {
    Kokkos::parallel_for("tessera::bias_broadcast", rows_cols(exec, y),
                         KOKKOS_LAMBDA(const Index i, const Index j) { y(i, j) = b(j); });
  }
}

/// \brief Adds b to every row of y.  b (N), y (B,N).
template <class BView, class YView>
void bias_add(const ExecSpace& exec, const BView& b, const YView& y) {
  if constexpr (rows_on_host<YView>()) {
    const Index cols = Index(y.extent(1));
    Kokkos::parallel_for("tessera::bias_add", range(exec, Index(y.extent(0))), KOKKOS_LAMBDA(const Index i) {
      TESSERA_SIMD
      for (Index j = 0; j < cols; ++j) y(i, j) += b(j);
    });
  } else {
    Kokkos::parallel_for("tessera::bias_add", rows_cols(exec, y),
                         KOKKOS_LAMBDA(const Index i, const Index j) { y(i, j) += b(j); });
  }
}

/// \brief db += column sums of dy (accumulates, for micro-batches).  dy (B,N), db (N).
/// One thread per block of columns, a loop over the rows: no atomics, and each column's
/// summation order is fixed (row by row). Blocks are one column wide on a GPU (neighbouring
/// threads read neighbouring columns) and 32 wide on a CPU (each thread reads rows of
/// contiguous columns instead of striding down one).
template <class DyView, class DbView>
void bias_backward(const ExecSpace& exec, const DyView& dy, const DbView& db) {
  using T = typename DbView::non_const_value_type;
  constexpr Index width = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible ? 32 : 1;
  const Index rows = Index(dy.extent(0)), cols = Index(dy.extent(1));
  Kokkos::parallel_for("tessera::bias_backward", range(exec, (cols + width - 1) / width),
                       KOKKOS_LAMBDA(const Index block) {
                         const Index j0 = block * width;
                         const Index n = cols - j0 < width ? cols - j0 : width;
                         T sum[width] = {};
                         for (Index i = 0; i < rows; ++i) {
                           TESSERA_SIMD
                           for (Index k = 0; k < n; ++k) sum[k] += dy(i, j0 + k);
                         }
                         for (Index k = 0; k < n; ++k) db(j0 + k) += sum[k];
                       });
}

}  // namespace tessera::kernels
