#pragma once
// Squared errors of predicted fields, per sample, and the gradient of the mean squared error:
//   err[b] = sum_k (p_bk - t_bk)^2,   ref[b] = sum_k t_bk^2,   dp_bk = scale * 2 (p_bk - t_bk) / count
// where `count` is the values of a whole sample. A rank holding a block of each field (spatial
// parallelism) passes its block; the sums over blocks are the whole field's, and the gradient is
// the same function of each element whatever the block. In double: err and ref feed the loss
// and the relative L2 error sqrt(err / ref) once summed over the blocks.
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief pred (B,K), target (B,K), dpred (B,K) (may alias pred), sums (B,2): err and ref per
/// row. One team per row.
template <class PView, class TView, class DView, class SView>
void field_errors(const ExecSpace& exec, const PView& pred, const TView& target, double count,
                  typename DView::non_const_value_type scale, const DView& dpred, const SView& sums) {
  using T = typename DView::non_const_value_type;
  using Team = Kokkos::TeamPolicy<ExecSpace>;
  const Index k = Index(pred.extent(1));
  const T factor = T(double(scale) * 2.0 / count);
  Kokkos::parallel_for(
      "tessera::field_errors", Team(exec, int(pred.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename Team::member_type& team) {
        const Index b = team.league_rank();
        double err = 0.0, ref = 0.0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, k),
            [&](const Index c, double& acc) {
              const T diff = pred(b, c) - target(b, c);
              acc += double(diff) * double(diff);
            },
            err);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, k),
            [&](const Index c, double& acc) { acc += double(target(b, c)) * double(target(b, c)); }, ref);
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k),
                             [&](const Index c) { dpred(b, c) = factor * (pred(b, c) - target(b, c)); });
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          sums(b, 0) = err;
          sums(b, 1) = ref;
        });
      });
}

}  // namespace tessera::kernels
