#pragma once
// The Llama family's gated MLP activation (SwiGLU): h = silu(g) u with silu(g) = g sigmoid(g),
// g and u the gate and up projections of the same input. Its gradients:
//   dg = dh u silu'(g),  silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))),   du = dh silu(g)
#include "kernels/math.hpp"
#include "kernels/precision.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

template <class T>
KOKKOS_INLINE_FUNCTION T sigmoid(T z) {
  return T(1) / (T(1) + math::vexp(-z));
}

/// \brief h = silu(g) u, element by element. g, u (B,N) (fp32, or bf16 read as their values),
/// h (B,N) (fp32, or bf16 that gets the values rounded once). `Comp` is the arithmetic's type.
template <class Comp, class GView, class UView, class HView>
void swiglu_forward(const ExecSpace& exec, const GView& g, const UView& u, const HView& h) {
  for_rows("tessera::swiglu_forward", exec, Index(h.extent(0)), Index(h.extent(1)),
           KOKKOS_LAMBDA(const Index i, const Index j) {
             const Comp z = Comp(loaded(g(i, j)));
             stored(h(i, j)) = z * sigmoid(z) * Comp(loaded(u(i, j)));
           });
}

/// \brief dg = dh u silu'(g) and du = dh silu(g). g, u (B,N) as saved by the forward, dh (B,N);
/// dg, du (B,N) (fp32 or bf16, stored()); none aliases another.
template <class Comp, class GView, class UView, class DhView, class DgView, class DuView>
void swiglu_backward(const ExecSpace& exec, const GView& g, const UView& u, const DhView& dh, const DgView& dg,
                     const DuView& du) {
  for_rows("tessera::swiglu_backward", exec, Index(dh.extent(0)), Index(dh.extent(1)),
           KOKKOS_LAMBDA(const Index i, const Index j) {
             const Comp z = Comp(loaded(g(i, j))), s = sigmoid(z), d = Comp(loaded(dh(i, j)));
             stored(dg(i, j)) = d * Comp(loaded(u(i, j))) * s * (Comp(1) + z * (Comp(1) - s));
             stored(du(i, j)) = d * z * s;
           });
}

}  // namespace tessera::kernels
