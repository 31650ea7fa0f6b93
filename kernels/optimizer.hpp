#pragma once
// Optimizer updates over flat parameter arrays, with PyTorch's semantics (torch.optim.SGD with
// dampening 0, torch.optim.AdamW). All arrays are the same length n: parameters, gradients and
// optimizer state are laid out alike (one flat buffer per model, see nn/param_store.hpp).
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/math.hpp"
#include "kernels/precision.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

struct SgdHyper {
  double lr = 0.0;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// \brief What an update does in the same pass besides the step: each gradient is multiplied
/// by grad_factor first (clipping, undoing a loss scale; AdamW gets the bits a separate
/// kernels::scale pass would give, SGD's weight-decay sum may fuse the product into an FMA), and
/// where bf16 is not empty (as long as p) each updated
/// parameter is written there rounded to bf16 (the weights' copies that bf16 products read), so
/// that neither costs a pass of its own over the whole model. `Mem`: the copies' memory (the
/// parameters' own; host memory where optimizer.offload runs the update on the host of a GPU build).
template <class Mem = MemSpace>
struct UpdateExtrasIn {
  double grad_factor = 1.0;
  VectorU<std::uint16_t, Mem> bf16;
};
using UpdateExtras = UpdateExtrasIn<>;

/// Elements per block of a host update pass: one thread per block, a vector loop inside.
inline constexpr Index update_block = 4096;

/// \brief Runs element(i) for every i, which updates element i and returns the parameter's new
/// value; where extras.bf16 is not empty, that value rounded to bf16 is stored there too. The loop
/// is written twice so that neither tests the option per element, and the copy is made from the
/// value in hand (reading p back through to_bf16_bits' bit copy would keep the loop from being
/// vectorised). On the host each thread takes blocks of update_block elements and runs a loop
/// marked simd over each: a flat range leaves the vectorising to the compiler, which must prove
/// that the stores do not reach the captured hyperparameters, and in an OpenMP Kokkos it gave up
/// on the AdamW loop with the bf16 copies (scalar: 5x slower, docs/performance.md "Host optimizer
/// update"). The element function is the same either way, so are the results, bit for bit.
/// `Exec`: where it runs (the default execution space, or the host's for an offloaded update).
template <class Exec, class PView, class Mem, class F>
void update_pass(const Exec& exec, const char* name, const PView& p, const UpdateExtrasIn<Mem>& x, const F& element) {
  if (x.bf16.extent(0) > 0 && x.bf16.extent(0) != p.extent(0))
    throw std::invalid_argument(std::string(name) + ": bf16 copies of " + std::to_string(x.bf16.extent(0)) +
                                " elements for " + std::to_string(p.extent(0)) + " parameters");
  using Policy = Kokkos::RangePolicy<Exec, Kokkos::IndexType<Index>>;
  const Index n = Index(p.extent(0));
  const VectorU<std::uint16_t, Mem> out = x.bf16;
  if constexpr (Kokkos::SpaceAccessibility<HostSpace, typename Exec::memory_space>::accessible) {
    const Index blocks = (n + update_block - 1) / update_block;
    if (out.extent(0) > 0) {
      Kokkos::parallel_for(name, Policy(exec, 0, blocks), KOKKOS_LAMBDA(const Index b) {
        const Index end = b * update_block + update_block < n ? b * update_block + update_block : n;
        TESSERA_SIMD
        for (Index i = b * update_block; i < end; ++i) out(i) = to_bf16_bits(element(i));
      });
    } else {
      Kokkos::parallel_for(name, Policy(exec, 0, blocks), KOKKOS_LAMBDA(const Index b) {
        const Index end = b * update_block + update_block < n ? b * update_block + update_block : n;
        TESSERA_SIMD
        for (Index i = b * update_block; i < end; ++i) element(i);
      });
    }
  } else if (out.extent(0) > 0) {
    Kokkos::parallel_for(name, Policy(exec, 0, n), KOKKOS_LAMBDA(const Index i) { out(i) = to_bf16_bits(element(i)); });
  } else {
    Kokkos::parallel_for(name, Policy(exec, 0, n), KOKKOS_LAMBDA(const Index i) { element(i); });
  }
}

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
template <class Exec, class PView, class GView, class BView, class Mem = MemSpace>
void sgd_step(const Exec& exec, const PView& p, const GView& grad, const BView& buf,
              const SgdHyper& h, const UpdateExtrasIn<Mem>& extras = {}) {
  using T = typename PView::non_const_value_type;
  const T lr = T(h.lr), momentum = T(h.momentum), wd = T(h.weight_decay), gf = T(extras.grad_factor);
  const bool nesterov = h.nesterov;
  if (momentum != T(0) && buf.extent(0) != p.extent(0)) {
    throw std::invalid_argument("tessera::sgd_step: momentum buffer has " +
                                std::to_string(buf.extent(0)) + " elements, parameters " +
                                std::to_string(p.extent(0)));
  }
  if (momentum != T(0)) {
    update_pass(exec, "tessera::sgd_step", p, extras, KOKKOS_LAMBDA(const Index i) {
      T pi = p(i), bi = buf(i);
      sgd_element(pi, T(grad(i)) * gf, bi, lr, momentum, wd, nesterov);
      p(i) = pi;
      buf(i) = bi;
      return pi;
    });
  } else {
    update_pass(exec, "tessera::sgd_step", p, extras, KOKKOS_LAMBDA(const Index i) {
      T pi = p(i), unused = T(0);
      sgd_element(pi, T(grad(i)) * gf, unused, lr, T(0), wd, false);
      p(i) = pi;
      return pi;
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
template <class Exec, class PView, class GView, class MView, class VView, class Mem = MemSpace>
void adamw_step(const Exec& exec, const PView& p, const GView& grad, const MView& m,
                const VView& v, const AdamWHyper& h, std::int64_t step, const UpdateExtrasIn<Mem>& extras = {}) {
  using T = typename PView::non_const_value_type;
  if (step < 1) throw std::invalid_argument("tessera::adamw_step: step counts from 1");
  // Bias corrections on the host, in double.
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  const T lr = T(h.lr), b1 = T(h.beta1), b2 = T(h.beta2), eps = T(h.eps), wd = T(h.weight_decay);
  const T step_size = T(h.lr / bc1), sqrt_bc2 = T(std::sqrt(bc2)), gf = T(extras.grad_factor);
  update_pass(exec, "tessera::adamw_step", p, extras, KOKKOS_LAMBDA(const Index i) {
    T pi = p(i), mi = m(i), vi = v(i);
    adamw_element(pi, T(grad(i)) * gf, mi, vi, lr, b1, b2, eps, wd, step_size, sqrt_bc2);
    p(i) = pi;
    m(i) = mi;
    v(i) = vi;
    return pi;
  });
}

}  // namespace tessera::kernels
