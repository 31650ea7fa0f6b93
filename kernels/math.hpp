#pragma once
// Device-callable math shared by the kernels. Kokkos 3.x keeps these functions in
// Kokkos::Experimental, Kokkos 4.x in Kokkos; everything else includes this header and writes
// tessera::math::exp etc., so the kernels compile against both.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace tessera::math {

#if KOKKOS_VERSION >= 40000
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::isfinite;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::cos;
#else
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::cos;
#endif

}  // namespace tessera::math

namespace tessera::math {

// Branch-free float exp and erf for the hot element-wise kernels (GELU, softmax, cross-entropy).
// libm's expf/erff are calls, so a loop that uses them stays scalar; these are straight-line
// polynomials that the compiler vectorises (16 lanes with AVX-512) and that run unchanged on GPUs.
// Coefficients are least-squares fits made for Tessera (tests/unit/test_math.cpp checks them
// against double precision over the whole float range). Double precision keeps the library calls:
// the gradient checks run in double.
namespace detail {

KOKKOS_INLINE_FUNCTION float pow2i(std::int32_t n) {  // 2^n for n in [-126, 127]
  return __builtin_bit_cast(float, (n + 127) << 23);
}

// exp(x): x = n ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2), exp(r) = 1 + r + r^2 q(r),
// 2^n applied in two halves so that results near the float range's ends stay exact.
// Relative error <= 2 ulp; NaN in, NaN out; x > 88.7228 gives inf, x < -103.97 gives 0.
KOKKOS_INLINE_FUNCTION float exp_f32(float x) {
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float xc = x < -104.0f ? -104.0f : (x > 88.8f ? 88.8f : x);
  const float t = xc * 1.44269504088896341f + shifter;
  const std::int32_t n = __builtin_bit_cast(std::int32_t, t) - __builtin_bit_cast(std::int32_t, shifter);
  const float nf = t - shifter;
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float q = 1.989927230e-04f;
  q = q * r + 1.393364954e-03f;
  q = q * r + 8.333298487e-03f;
  q = q * r + 4.166646489e-02f;
  q = q * r + 1.666666672e-01f;
  q = q * r + 5.000000013e-01f;
  const float p = 1.0f + r + r * r * q;
  const std::int32_t n1 = n >> 1;
  const float y = p * pow2i(n1) * pow2i(n - n1);
  const float inf = __builtin_bit_cast(float, std::int32_t(0x7f800000));
  return x != x ? x : (x > 88.7228394f ? inf : y);
}

// erf(x) given e = exp(-x^2) (GELU's backward shares it with the normal density):
// |x| < 1: x p(x^2); 1 <= |x| < 4: 1 - e q(1/|x|) with q ~ erfc(a) exp(a^2); beyond, +-1.
// Absolute error <= 1.5e-7, relative error below |x| = 1 <= 2e-7.
KOKKOS_INLINE_FUNCTION float erf_f32(float x, float e) {
  const float a = x < 0.0f ? -x : x;
  const float s = x * x;
  float p = -5.667987482e-04f;
  p = p * s + 4.927417625e-03f;
  p = p * s + -2.672089122e-02f;
  p = p * s + 1.128057876e-01f;
  p = p * s + -3.761239065e-01f;
  p = p * s + 1.128379147e+00f;
  const float small = x * p;
  const float u = 1.0f / (a < 1.0f ? 1.0f : a);
  float q = -1.207988462e-02f;
  q = q * u + 4.147293369e-02f;
  q = q * u + -3.256680632e-03f;
  q = q * u + -2.105932277e-01f;
  q = q * u + 4.749651454e-01f;
  q = q * u + -4.620603851e-01f;
  q = q * u + 3.947317202e-02f;
  q = q * u + 5.594154848e-01f;
  q = q * u + 2.469873515e-04f;
  const float big = a >= 4.0f ? 1.0f : 1.0f - e * q;
  const float r = a < 1.0f ? small : (x < 0.0f ? -big : big);
  return x != x ? x : r;
}

}  // namespace detail

/// \brief exp(x): the vectorisable polynomial for float, the library's exp otherwise.
template <class T>
KOKKOS_INLINE_FUNCTION T vexp(T x) {
  if constexpr (std::is_same_v<T, float>) return detail::exp_f32(x);
  else return exp(x);
}

/// \brief erf(x) given e = exp(-x^2) already computed: the vectorisable form for float, the
/// library's erf otherwise (which ignores e).
template <class T>
KOKKOS_INLINE_FUNCTION T verf(T x, T e) {
  if constexpr (std::is_same_v<T, float>) return detail::erf_f32(x, e);
  else return erf(x);
}

/// \brief erf(x): the vectorisable form for float, the library's erf otherwise.
template <class T>
KOKKOS_INLINE_FUNCTION T verf(T x) {
  if constexpr (std::is_same_v<T, float>) return detail::erf_f32(x, detail::exp_f32(-x * x));
  else return erf(x);
}

}  // namespace tessera::math
