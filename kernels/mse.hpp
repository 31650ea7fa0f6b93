#pragma once
// Mean squared error per row and its gradient.
//   loss_i = (1/K) sum_k (p_ik - t_ik)^2
//   dp_ik  = scale * 2 (p_ik - t_ik) / K
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief One row: writes dpred_row and returns the row's loss. dpred may alias pred.
template <class T, class PRow, class TRow, class DRow>
KOKKOS_INLINE_FUNCTION double mse_row(const PRow& pred, const TRow& target, const DRow& dpred,
                                      Index k, T scale) {
  double sum = 0.0;
  const T grad_factor = scale * T(2) / T(k);
  for (Index c = 0; c < k; ++c) {
    const T diff = pred(c) - target(c);
    sum += double(diff) * double(diff);
    dpred(c) = grad_factor * diff;
  }
  return sum / double(k);
}

/// \brief Returns the sum over rows of the row losses and writes the gradient.
/// pred (B,K), target (B,K), dpred (B,K) (may alias pred).
template <class PView, class TView, class DView>
double mse(const ExecSpace& exec, const PView& pred, const TView& target,
           typename DView::non_const_value_type scale, const DView& dpred) {
  using T = typename DView::non_const_value_type;
  const Index k = Index(pred.extent(1));
  double loss_sum = 0.0;
  Kokkos::parallel_reduce(
      "tessera::mse", range(exec, Index(pred.extent(0))),
      KOKKOS_LAMBDA(const Index i, double& acc) {
        acc += mse_row<T>([&](Index c) { return pred(i, c); }, [&](Index c) { return target(i, c); },
                          [&](Index c) -> T& { return dpred(i, c); }, k, scale);
      },
      loss_sum);
  return loss_sum;
}

}  // namespace tessera::kernels
