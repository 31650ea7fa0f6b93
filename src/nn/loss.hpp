#pragma once
// The training losses: softmax cross-entropy over class labels, mean squared error over
// regression targets. Each returns the sum of per-sample losses (the caller divides by the
// global batch) and writes d(scale * sum)/d(output).
#include <cstdint>

#include "core/config.hpp"
#include "kernels/mse.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/views.hpp"

namespace tessera::nn {

struct LossResult {
  double loss_sum = 0.0;     ///< sum over the rows of the per-sample loss
  std::int64_t correct = 0;  ///< classification: rows whose argmax is the label; MSE: 0
};

/// \brief Cross-entropy.  logits (B,C), labels (B), dlogits (B,C) = scale d(loss_sum)/dlogits.
template <class T>
LossResult cross_entropy(const ExecSpace& exec, const MatrixU<const T>& logits,
                         const VectorU<const std::int32_t>& labels, T scale,
                         const MatrixU<T>& dlogits) {
  const auto r = kernels::softmax_xent(exec, logits, labels, scale, dlogits);
  return {r.loss_sum, r.correct};
}

/// \brief MSE (mean over K per row).  pred (B,K), target (B,K), dpred (B,K).
template <class T>
LossResult mean_squared_error(const ExecSpace& exec, const MatrixU<const T>& pred,
                              const MatrixU<const T>& target, T scale, const MatrixU<T>& dpred) {
  return {kernels::mse(exec, pred, target, scale, dpred), 0};
}

}  // namespace tessera::nn
