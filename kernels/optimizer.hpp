#pragma once
// Optimizer updates over flat parameter arrays, with PyTorch's semantics (torch.optim.SGD with
// dampening 0, torch.optim.AdamW). All arrays are the same length n: parameters, gradients and
// optimizer state are laid out alike (one flat buffer per model, see nn/param_store.hpp).
#include <cmath>
#include <cstdint>

#include "kernels/math.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

struct SgdHyper {
  double lr = 0.0;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct AdamWHyper {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

/// \brief One SGD element: g = grad + wd p; buf = momentum buf + g;
/// g = nesterov ? g + momentum buf : buf; p -= lr g. With momentum 0 buf is neither read nor
/// written. buf starts at 0, which equals PyTorch's buf = g on the first step.
template <class T>
KOKKOS_INLINE_FUNCTION void sgd_element(T& p, T grad, T& buf, T lr, T momentum, T wd,
                                        bool nesterov) {
  T g = grad + wd * p;
  if (momentum != T(0)) {
    buf = momentum * buf + g;
    g = nesterov ? g + momentum * buf : buf;
  }
  p -= lr * g;
}

/// \brief SGD step.  p (n), grad (n), buf (n) momentum buffer (may be empty when momentum == 0).
template <class PView, class GView, class BView>
void sgd_step(const ExecSpace& exec, const PView& p, const GView& grad, const BView& buf,
              const SgdHyper& h) {
  using T = typename PView::non_const_value_type;
  const T lr = T(h.lr), momentum = T(h.momentum), wd = T(h.weight_decay);
  const bool nesterov = h.nesterov;
  if (momentum != T(0) && buf.extent(0) != p.extent(0)) {
    throw std::invalid_argument("tessera::sgd_step: momentum buffer has " +
                                std::to_string(buf.extent(0)) + " elements, parameters " +
                                std::to_string(p.extent(0)));
  }
  if (momentum != T(0)) {
    Kokkos::parallel_for("tessera::sgd_step", range(exec, Index(p.extent(0))),
                         KOKKOS_LAMBDA(const Index i) {
                           sgd_element(p(i), T(grad(i)), buf(i), lr, momentum, wd, nesterov);
                         });
  } else {
    Kokkos::parallel_for("tessera::sgd_step", range(exec, Index(p.extent(0))),
                         KOKKOS_LAMBDA(const Index i) {
                           T unused = T(0);
                           sgd_element(p(i), T(grad(i)), unused, lr, T(0), wd, false);
                         });
  }
}

/// \brief One AdamW element (decoupled weight decay, bias-corrected moments):
/// p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), bc1 = 1 - b1^t, bc2 = 1 - b2^t.
template <class T>
KOKKOS_INLINE_FUNCTION void adamw_element(T& p, T g, T& m, T& v, T lr, T b1, T b2, T eps, T wd,
                                          T step_size, T sqrt_bc2) {
  p *= T(1) - lr * wd;
  m = b1 * m + (T(1) - b1) * g;
  v = b2 * v + (T(1) - b2) * g * g;
  p -= step_size * m / (math::sqrt(v) / sqrt_bc2 + eps);
}

/// \brief AdamW step number `step` (1 for the first update).
/// p (n), grad (n), m (n) first moment, v (n) second moment; m and v start at 0.
template <class PView, class GView, class MView, class VView>
void adamw_step(const ExecSpace& exec, const PView& p, const GView& grad, const MView& m,
                const VView& v, const AdamWHyper& h, std::int64_t step) {
  using T = typename PView::non_const_value_type;
  if (step < 1) throw std::invalid_argument("tessera::adamw_step: step counts from 1");
  // Bias corrections on the host, in double.
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  const T lr = T(h.lr), b1 = T(h.beta1), b2 = T(h.beta2), eps = T(h.eps), wd = T(h.weight_decay);
  const T step_size = T(h.lr / bc1), sqrt_bc2 = T(std::sqrt(bc2));
  Kokkos::parallel_for("tessera::adamw_step", range(exec, Index(p.extent(0))),
                       KOKKOS_LAMBDA(const Index i) {
                         adamw_element(p(i), T(grad(i)), m(i), v(i), lr, b1, b2, eps, wd,
                                       step_size, sqrt_bc2);
                       });
}

}  // namespace tessera::kernels
