#pragma once
// Squared errors of predicted fields, per sample, and the gradient of the mean squared error of
// the standardised fields (nn::FieldNorm; inv_std = 1 everywhere without one):
//   err[b] = sum_k (p_bk - t_bk)^2,   ref[b] = sum_k t_bk^2,   std_err[b] = sum_k ((p_bk - t_bk) inv_c)^2
//   dh_bk = scale * 2 (p_bk - t_bk) inv_c / count
// where c is value k's channel (k / positions), `count` the values of a whole sample, and dh the
// gradient with respect to the standardised output h (p = h / inv_c + mean_c). A rank holding a
// block of each field (spatial parallelism) passes its block; the sums over blocks are the whole
// field's, and the gradient is the same function of each element whatever the block. In double:
// the sums feed the loss and the relative L2 error sqrt(err / ref) once summed over the blocks.
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief pred (B,K), target (B,K), dh (B,K) (may alias pred), inv_std (K / positions channels),
/// sums (B,3): err, ref and std_err per row. One team per row.
template <class PView, class TView, class DView, class IView, class SView>
void field_errors(const ExecSpace& exec, const PView& pred, const TView& target, double count,
                  typename DView::non_const_value_type scale, const IView& inv_std, Index positions,
                  const DView& dh, const SView& sums) {
  using T = typename DView::non_const_value_type;
  using Team = Kokkos::TeamPolicy<ExecSpace>;
  const Index k = Index(pred.extent(1));
  const T factor = T(double(scale) * 2.0 / count);
  Kokkos::parallel_for(
      "tessera::field_errors", Team(exec, int(pred.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename Team::member_type& team) {
        const Index b = team.league_rank();
        double err = 0.0, ref = 0.0, std_err = 0.0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, k),
            [&](const Index c, double& acc) {
              const T diff = pred(b, c) - target(b, c);
              acc += double(diff) * double(diff);
            },
            err);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, k),
            [&](const Index c, double& acc) {
              const double d = double(pred(b, c) - target(b, c)) * double(inv_std(c / positions));
              acc += d * d;
            },
            std_err);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, k),
            [&](const Index c, double& acc) { acc += double(target(b, c)) * double(target(b, c)); }, ref);
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k), [&](const Index c) {
          dh(b, c) = factor * (pred(b, c) - target(b, c)) * inv_std(c / positions);
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          sums(b, 0) = err;
          sums(b, 1) = ref;
          sums(b, 2) = std_err;
        });
      });
}

/// \brief x (B, C, P) = x scale[c] + shift[c], in place: a field standardised per channel, or
/// mapped back.
template <class T, class AView>
void affine_channels(const ExecSpace& exec, const AView& scale, const AView& shift, Index batch, Index channels,
                     Index positions, T* x) {
  Kokkos::parallel_for(
      "tessera::affine_channels",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * channels * positions),
      KOKKOS_LAMBDA(const Index e) {
        const Index c = (e / positions) % channels;
        x[e] = x[e] * scale(c) + shift(c);
      });
}

}  // namespace tessera::kernels
