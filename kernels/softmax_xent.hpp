#pragma once
// Fused softmax cross-entropy over a batch of logits, and its gradient.
//   loss_i   = log(sum_c exp(l_ic)) - l_i,label_i   (computed as m + log(sum exp(l - m)), m = row max)
//   dl_ic    = scale * (softmax(l_i)_c - [c == label_i])
// scale is what the caller wants the gradient multiplied by, usually 1/global_batch.
#include <cstdint>

#include "kernels/math.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// What one call of softmax_xent reports about its rows.
struct XentResult {
  double loss_sum = 0.0;      ///< sum over rows of the per-row loss (not scaled)
  std::int64_t correct = 0;   ///< rows whose argmax (lowest index on ties) equals the label
};

/// \brief One row: writes dlogits_row and returns the row's loss; sets is_correct.
/// logits and dlogits are accessed through functors so rows of any view type work; dlogits may
/// alias logits (every logit is read before its gradient is written).
template <class T, class Row, class DRow>
KOKKOS_INLINE_FUNCTION double softmax_xent_row(const Row& logit, const DRow& dlogit, Index classes,
                                               std::int32_t label, T scale, bool& is_correct) {
  // Row max and argmax (first index wins ties).
  T max = logit(0);
  Index arg = 0;
  for (Index c = 1; c < classes; ++c) {
    if (logit(c) > max) {
      max = logit(c);
      arg = c;
    }
  }
  is_correct = (arg == Index(label));
  // Log-sum-exp, shifted by the max.
  double sum = 0.0;
  for (Index c = 0; c < classes; ++c) sum += double(math::exp(logit(c) - max));
  const double lse = double(max) + math::log(sum);
  const double loss = lse - double(logit(label));
  // Gradient: (softmax - onehot) * scale.
  for (Index c = 0; c < classes; ++c) {
    const T p = T(math::exp(double(logit(c)) - lse));
    dlogit(c) = scale * (p - (c == Index(label) ? T(1) : T(0)));
  }
  return loss;
}

/// \brief Loss, accuracy count and gradient of softmax cross-entropy.
/// logits (B,C), labels (B) int32 in [0,C), dlogits (B,C) (may alias logits).
/// Labels are trusted: validate them when the data is read.
template <class LView, class YView, class DView>
XentResult softmax_xent(const ExecSpace& exec, const LView& logits, const YView& labels,
                        typename DView::non_const_value_type scale, const DView& dlogits) {
  using T = typename DView::non_const_value_type;
  const Index classes = Index(logits.extent(1));
  XentResult result;
  Kokkos::parallel_reduce(
      "tessera::softmax_xent", range(exec, Index(logits.extent(0))),
      KOKKOS_LAMBDA(const Index i, double& loss_sum, std::int64_t& correct) {
        bool is_correct = false;
        loss_sum += softmax_xent_row<T>([&](Index c) { return logits(i, c); },
                                        [&](Index c) -> T& { return dlogits(i, c); }, classes,
                                        labels(i), scale, is_correct);
        correct += is_correct ? 1 : 0;
      },
      result.loss_sum, result.correct);
  return result;
}

}  // namespace tessera::kernels
