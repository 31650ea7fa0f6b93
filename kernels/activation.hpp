#pragma once
// Element-wise activations and their derivatives.
//   relu(z) = max(z, 0);                 relu'(z) = [z > 0]
//   gelu(z) = z Phi(z) = z/2 (1 + erf(z/sqrt 2))   (exact form, PyTorch nn.GELU's default)
//   gelu'(z) = Phi(z) + z exp(-z^2/2)/sqrt(2 pi)
//   gelu_tanh(z) = z/2 (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))   (GPT-2's; the gpt's option)
// In float, Phi is math::vnormal_cdf's tail form (no cancellation for negative z).
// Backward kernels take the pre-activation z (gelu_backward_saved: the derivative its forward
// kept), so dz may alias dy (in-place backward).
#include "kernels/math.hpp"
#include "kernels/precision.hpp"
#include "kernels/simd.hpp"
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
  const T x = z * inv_sqrt2;
  return z * math::vnormal_cdf(x, math::vexp(-x * x));
}

template <class T>
KOKKOS_INLINE_FUNCTION T gelu_backward_element(T z, T dy) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  const T inv_sqrt_2pi = T(0.39894228040143267794);
  const T x = z * inv_sqrt2;
  const T e = math::vexp(-x * x);  // exp(-z^2/2): the density's and, for float, the cdf's
  const T cdf = math::vnormal_cdf(x, e);
  const T pdf = inv_sqrt_2pi * e;
  return dy * (cdf + z * pdf);
}

/// \brief gelu(z) and gelu'(z) together (one exp for both; y bitwise gelu(z)).
template <class T>
KOKKOS_INLINE_FUNCTION void gelu_with_derivative(T z, T& y, T& dydz) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  const T inv_sqrt_2pi = T(0.39894228040143267794);
  const T x = z * inv_sqrt2;
  const T e = math::vexp(-x * x);
  const T cdf = math::vnormal_cdf(x, e);
  y = z * cdf;
  dydz = cdf + z * (inv_sqrt_2pi * e);
}

/// GPT-2's GELU, the tanh form: z/2 (1 + tanh(u)), u = sqrt(2/pi) (z + 0.044715 z^3), computed as
/// z s with s = (1 + tanh u)/2 = 1/(1 + exp(-2u)): nothing cancels where tanh u is near -1. -2u is
/// clamped at 80 (exp stays finite; there s < 2e-35 and y is 0 to within 1e-33 |z|).
///   gelu_tanh'(z) = s + z s (1 - s) 2 sqrt(2/pi) (1 + 3 0.044715 z^2), with 1 - s = exp(-2u) s.
template <class T>
KOKKOS_INLINE_FUNCTION void gelu_tanh_with_derivative(T z, T& y, T& dydz) {
  const T c = T(0.79788456080286535588);  // sqrt(2/pi)
  const T a = T(0.044715);
  const T z2 = z * z;
  const T m2u = T(-2) * c * z * (T(1) + a * z2);
  const T e = math::vexp(m2u < T(80) ? m2u : T(80));
  const T s = T(1) / (T(1) + e);
  y = z * s;
  dydz = s + z * s * (e * s) * (T(2) * c * (T(1) + T(3) * a * z2));
}

template <class T>
KOKKOS_INLINE_FUNCTION T gelu_tanh(T z) {
  T y, d;
  gelu_tanh_with_derivative(z, y, d);
  return y;
}

/// \brief y = relu(z).  z (n), y (n); y may alias z. y may be a bf16 buffer (std::uint16_t bit
/// patterns): it gets the values rounded to bf16 (kernels/precision.hpp's stored()).
template <class ZView, class YView>
void relu_forward(const ExecSpace& exec, const ZView& z, const YView& y) {
  Kokkos::parallel_for("tessera::relu_forward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { stored(y(i)) = relu(z(i)); });
}

/// \brief dz = dy * relu'(z).  z (n), dy (n), dz (n); dz may alias dy.
template <class ZView, class DyView, class DzView>
void relu_backward(const ExecSpace& exec, const ZView& z, const DyView& dy, const DzView& dz) {
  Kokkos::parallel_for("tessera::relu_backward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { dz(i) = relu_backward_element(z(i), dy(i)); });
}

/// \brief y = gelu(z).  z (n), y (n); y may alias z. y may be a bf16 buffer, as relu_forward's.
template <class ZView, class YView>
void gelu_forward(const ExecSpace& exec, const ZView& z, const YView& y) {
  Kokkos::parallel_for("tessera::gelu_forward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { stored(y(i)) = gelu(z(i)); });
}

/// \brief dz = dy * gelu'(z).  z (n), dy (n), dz (n); dz may alias dy.
template <class ZView, class DyView, class DzView>
void gelu_backward(const ExecSpace& exec, const ZView& z, const DyView& dy, const DzView& dz) {
  Kokkos::parallel_for("tessera::gelu_backward", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { dz(i) = gelu_backward_element(z(i), dy(i)); });
}

/// The derivatives' element functions as types, for kernels templated on the activation.
struct ReluGrad {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T z, T dy) const { return relu_backward_element(z, dy); }
};
struct GeluGrad {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T z, T dy) const { return gelu_backward_element(z, dy); }
};

/// \brief relu_backward or gelu_backward (Grad: ReluGrad, GeluGrad) that also writes dz rounded
/// to bf16 into dz16 (bit patterns), for a layer whose bias gradient sums the fp32 values and
/// whose two products read bf16: one pass instead of the pass and a conversion per product.
/// z (n), dy (n), dz (n; may alias dy), dz16 (n).
template <class Grad, class ZView, class DyView, class DzView, class Dz16View>
void activation_backward_twice(const ExecSpace& exec, const ZView& z, const DyView& dy, const DzView& dz,
                               const Dz16View& dz16) {
  Kokkos::parallel_for("tessera::activation_backward_twice", range(exec, Index(z.extent(0))),
                       KOKKOS_LAMBDA(const Index i) {
                         const auto g = Grad()(z(i), dy(i));
                         dz(i) = g;
                         dz16(i) = to_bf16_bits(g);
                       });
}

/// The two GELUs' value-and-derivative functions as types, for the kernel templated on the form.
struct GeluExactForm {
  template <class T>
  KOKKOS_INLINE_FUNCTION void operator()(T z, T& y, T& dydz) const { gelu_with_derivative(z, y, dydz); }
};
struct GeluTanhForm {
  template <class T>
  KOKKOS_INLINE_FUNCTION void operator()(T z, T& y, T& dydz) const { gelu_tanh_with_derivative(z, y, dydz); }
};

template <class Form, class BView, class ZView, class YView, class DView>
void gelu_forward_saving_derivative_as(const ExecSpace& exec, const char* name, const BView& b, const ZView& z,
                                       const YView& y, const DView& d) {
  using T = typename DView::non_const_value_type;
  const auto element = KOKKOS_LAMBDA(const Index i, const Index j) {
    T yij, dij;
    Form()(T(loaded(z(i, j)) + b(j)), yij, dij);
    stored(y(i, j)) = yij;
    d(i, j) = dij;
  };
  for_rows(name, exec, Index(d.extent(0)), Index(d.extent(1)), element);
}

/// \brief y = gelu(z + b) and d = gelu'(z + b), row by row, so that backward is one product
/// (gelu_backward_saved): the derivative costs as much as the value, and a forward that keeps it
/// saves that cost in backward. b is the bias of the layer whose product z is, added in the same
/// pass.  b (N), z (B,N), y (B,N), d (B,N); d may alias z (the pre-activation is then no longer
/// needed). z may be a bf16 buffer (read as its float values: a product stored in bf16). y may be
/// a bf16 buffer (std::uint16_t bit patterns): it gets the values rounded to
/// bf16 (kernels/precision.hpp's stored()); d stays in the precision of the computation.
/// `tanh`: GPT-2's tanh form (gelu_tanh_with_derivative) instead of the exact one.
template <class BView, class ZView, class YView, class DView>
void gelu_forward_saving_derivative(const ExecSpace& exec, const BView& b, const ZView& z, const YView& y,
                                    const DView& d, bool tanh = false) {
  if (tanh)
    gelu_forward_saving_derivative_as<GeluTanhForm>(exec, "tessera::gelu_tanh_forward_saving_derivative", b, z, y, d);
  else
    gelu_forward_saving_derivative_as<GeluExactForm>(exec, "tessera::gelu_forward_saving_derivative", b, z, y, d);
}

/// \brief dz = dy * d with d = gelu'(z + b) from gelu_forward_saving_derivative, and db += the
/// column sums of dz: the gradient of the bias b in the same pass (accumulates, for
/// micro-batches; one thread per block of columns, each column's order fixed, as
/// bias_backward).  d (B,N), dy (B,N), dz (B,N) (may alias dy), db (N). dy and dz may be bf16
/// buffers (std::uint16_t bit patterns): dy is read as its float values, dz gets dz rounded to
/// bf16, db the sums of the unrounded values.
template <class DView, class DyView, class DzView, class DbView>
void gelu_backward_saved(const ExecSpace& exec, const DView& d, const DyView& dy, const DzView& dz,
                         const DbView& db) {
  using T = typename DbView::non_const_value_type;
  const Index rows = Index(dz.extent(0)), cols = Index(dz.extent(1));
  const Index width = column_block(exec, cols);
  Kokkos::parallel_for("tessera::gelu_backward_saved", range(exec, (cols + width - 1) / width),
                       KOKKOS_LAMBDA(const Index block) {
                         const Index j0 = block * width;
                         const Index n = cols - j0 < width ? cols - j0 : width;
                         T sum[column_block_max] = {};
                         for (Index i = 0; i < rows; ++i) {
                           TESSERA_SIMD
                           for (Index k = 0; k < n; ++k) {
                             const T g = T(loaded(dy(i, j0 + k)) * d(i, j0 + k));
                             stored(dz(i, j0 + k)) = g;
                             sum[k] += g;
                           }
                         }
                         for (Index k = 0; k < n; ++k) db(j0 + k) += sum[k];
                       });
}

}  // namespace tessera::kernels
