#pragma once
// Bias of a linear layer: broadcast into the rows of the output, and its gradient, the column
// sums of the output gradient.
#include "kernels/precision.hpp"
#include "kernels/simd.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief Every row of y becomes b.  b (N), y (B,N).
template <class BView, class YView>
void bias_broadcast(const ExecSpace& exec, const BView& b, const YView& y) {
  for_rows("tessera::bias_broadcast", exec, Index(y.extent(0)), Index(y.extent(1)),
           KOKKOS_LAMBDA(const Index i, const Index j) { y(i, j) = b(j); });
}

/// \brief Adds b to every row of y.  b (N), y (B,N).
template <class BView, class YView>
void bias_add(const ExecSpace& exec, const BView& b, const YView& y) {
  for_rows("tessera::bias_add", exec, Index(y.extent(0)), Index(y.extent(1)),
           KOKKOS_LAMBDA(const Index i, const Index j) { y(i, j) += b(j); });
}

/// \brief y = p + (b + r): a layer's bias and the residual stream added to its product p in one
/// pass.  b (N), r (B,N), p (B,N), y (B,N); p may be a bf16 buffer (std::uint16_t bit patterns,
/// read as its float values: a product stored in bf16) or y itself.
template <class BView, class RView, class PView, class YView>
void bias_residual_add(const ExecSpace& exec, const BView& b, const RView& r, const PView& p, const YView& y) {
  for_rows("tessera::bias_residual_add", exec, Index(y.extent(0)), Index(y.extent(1)),
           KOKKOS_LAMBDA(const Index i, const Index j) { y(i, j) = loaded(p(i, j)) + (b(j) + r(i, j)); });
}

/// \brief y += b + r: a row-parallel layer's bias and the residual stream added to its
/// (tensor-summed) product in one pass.  b (N), r (B,N), y (B,N).
template <class BView, class RView, class YView>
void bias_residual_add(const ExecSpace& exec, const BView& b, const RView& r, const YView& y) {
  bias_residual_add(exec, b, r, y, y);
}

/// \brief db += column sums of dy (accumulates, for micro-batches).  dy (B,N), db (N); dy may be
/// a bf16 buffer (std::uint16_t bit patterns), summed as its float values.
/// One thread per block of column_block() columns, a loop over the rows: no atomics, and each
/// column's summation order is fixed (row by row).
template <class DyView, class DbView>
void bias_backward(const ExecSpace& exec, const DyView& dy, const DbView& db) {
  using T = typename DbView::non_const_value_type;
  const Index rows = Index(dy.extent(0)), cols = Index(dy.extent(1));
  const Index width = column_block(exec, cols);
  Kokkos::parallel_for("tessera::bias_backward", range(exec, (cols + width - 1) / width),
                       KOKKOS_LAMBDA(const Index block) {
                         const Index j0 = block * width;
                         const Index n = cols - j0 < width ? cols - j0 : width;
                         T sum[column_block_max] = {};
                         for (Index i = 0; i < rows; ++i) {
                           TESSERA_SIMD
                           for (Index k = 0; k < n; ++k) sum[k] += loaded(dy(i, j0 + k));
                         }
                         for (Index k = 0; k < n; ++k) db(j0 + k) += sum[k];
                       });
}

}  // namespace tessera::kernels
