#pragma once
// Element-wise activations and their derivatives.
//   relu(z) = max(z, 0);                 relu'(z) = [z > 0]
//   gelu(z) = z/2 (1 + erf(z/sqrt 2))    (exact form, PyTorch nn.GELU's default)
//   gelu'(z) = (1 + erf(z/sqrt 2))/2 + z exp(-z^2/2)/sqrt(2 pi)
// Backward kernels take the pre-activation z, so dz may alias dy (in-place backward).
#include "kernels/math.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

template <class T>
KOKKOS_INLINE_FUNCTION T relu(T z) {
  return z > T(0) ? z : T(0);
}

template <class T>
KOKKOS_INLINE_FUNCTION T relu_backward_element(T z, T dy) {
  return z > T(0) ? dy : T(0);
}

template <class T>
KOKKOS_INLINE_FUNCTION T gelu(T z) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  return T(0.5) * z * (T(1) + math::verf(z * inv_sqrt2));
}

template <class T>
KOKKOS_INLINE_FUNCTION T gelu_backward_element(T z, T dy) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  const T inv_sqrt_2pi = T(0.39894228040143267794);
  const T x = z * inv_sqrt2;
  const T e = math::vexp(-x * x);  // exp(-z^2/2): the density's and, for float, erf's
  const T cdf = T(0.5) * (T(1) + math::verf(x, e));
  const T pdf = inv_sqrt_2pi * e;
  return dy * (cdf + z * pdf);
}

/// \brief gelu(z) and gelu'(z) together (one erf and one exp for both).
template <class T>
KOKKOS_INLINE_FUNCTION void gelu_with_derivative(T z, T& y, T& dydz) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  const T inv_sqrt_2pi = T(0.39894228040143267794);
  const T x = z * inv_sqrt2;
  const T e = math::vexp(-x * x);
  const T cdf = T(0.5) * (T(1) + math::verf(x, e));
  y = z * cdf;
  dydz = cdf + z * (inv_sqrt_2pi * e);
}

/// \brief y = relu(z).  z (n), y (n); y may alias z.
template <class ZView, class YView>
void relu_forward(const ExecSpace& exec, const ZView& z, const YView& y) {
  Kokkos::parallel_for("tessera::relu_forward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { y(i) = relu(z(i)); });
}

/// \brief dz = dy * relu'(z).  z (n), dy (n), dz (n); dz may alias dy.
template <class ZView, class DyView, class DzView>
void relu_backward(const ExecSpace& exec, const ZView& z, const DyView& dy, const DzView& dz) {
  Kokkos::parallel_for("tessera::relu_backward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { dz(i) = relu_backward_element(z(i), dy(i)); });
}

/// \brief y = gelu(z).  z (n), y (n); y may alias z.
template <class ZView, class YView>
void gelu_forward(const ExecSpace& exec, const ZView& z, const YView& y) {
  Kokkos::parallel_for("tessera::gelu_forward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { y(i) = gelu(z(i)); });
}

/// \brief dz = dy * gelu'(z).  z (n), dy (n), dz (n); dz may alias dy.
template <class ZView, class DyView, class DzView>
void gelu_backward(const ExecSpace& exec, const ZView& z, const DyView& dy, const DzView& dz) {
  Kokkos::parallel_for("tessera::gelu_backward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { dz(i) = gelu_backward_element(z(i), dy(i)); });
}

/// \brief y = gelu(z) and d = gelu'(z), so that backward is one product (gelu_backward_saved):
/// the derivative costs as much as the value, and a forward that keeps it saves that cost in
/// backward. z (n), y (n), d (n); d may alias z (the pre-activation is then no longer needed).
template <class ZView, class YView, class DView>
void gelu_forward_saving_derivative(const ExecSpace& exec, const ZView& z, const YView& y, const DView& d) {
  using T = typename YView::non_const_value_type;
  Kokkos::parallel_for("tessera::gelu_forward_saving_derivative", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) {
                         T yi, di;
                         gelu_with_derivative(T(z(i)), yi, di);
                         y(i) = yi;
                         d(i) = di;
                       });
}

/// \brief dz = dy * d with d = gelu'(z) from gelu_forward_saving_derivative.  dz may alias dy.
template <class DView, class DyView, class DzView>
void gelu_backward_saved(const ExecSpace& exec, const DView& d, const DyView& dy, const DzView& dz) {
  Kokkos::parallel_for("tessera::gelu_backward_saved", range(exec, Index(d.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { dz(i) = dy(i) * d(i); });
}

}  // namespace tessera::kernels
