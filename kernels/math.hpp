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

// Branch-free float exp and normal cdf for the hot element-wise kernels (GELU, softmax,
// cross-entropy). libm's expf/erff are calls, so a loop that uses them stays scalar; these are straight-line
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

// The standard normal distribution's cdf Phi(z) = (1 + erf(x))/2 at x = z/sqrt(2), given
// e = exp(-x^2) (GELU shares it with the normal density). The tail Phi(-|z|) = erfc(|x|)/2 is
// e R(t)/2 with t = 1/(1 + 0.416 |x|) and R a degree-8 polynomial fitted to erfcx(a) =
// exp(a^2) erfc(a) on [0, 9.4] (least squares reweighted towards the minimax of the relative
// error; 3.2e-8 in exact arithmetic); Phi(|z|) = 1 - Phi(-|z|). Nothing cancels, so the tail keeps
// its relative accuracy where 1 + erf(x) in float loses it (below z = -3): relative error
// <= 5e-7 + 6e-8 x^2 while the tail is a normal float (the second term is e's, from the rounded
// float x*x it was computed from), absolute error <= 2.5e-7 everywhere; one division and nine
// FMAs where erf took two polynomials, a division and four selects.
KOKKOS_INLINE_FUNCTION float normal_cdf_f32(float x, float e) {
  const float a = x < 0.0f ? -x : x;
  const float t = 1.0f / (1.0f + 0.416f * a);
  float r = 7.940874249e-02f;
  r = r * t + -3.727876842e-01f;
  r = r * t + 5.592593551e-01f;
  r = r * t + -2.515682280e-01f;
  r = r * t + 3.432433009e-01f;
  r = r * t + 1.649968922e-01f;
  r = r * t + 2.436102182e-01f;
  r = r * t + 2.337978035e-01f;
  r = r * t + 3.956187356e-05f;
  const float tail = 0.5f * e * r;
  const float cdf = x < 0.0f ? tail : 1.0f - tail;
  return x != x ? x : cdf;
}

}  // namespace detail

/// \brief exp(x): the vectorisable polynomial for float, the library's exp otherwise.
template <class T>
KOKKOS_INLINE_FUNCTION T vexp(T x) {
  if constexpr (std::is_same_v<T, float>) return detail::exp_f32(x);
  else return exp(x);
}

/// \brief Phi(z) = (1 + erf(x))/2, the standard normal cdf, at x = z/sqrt(2) given
/// e = exp(-x^2) already computed: the vectorisable tail form for float, the library's erf
/// otherwise (which ignores e).
template <class T>
KOKKOS_INLINE_FUNCTION T vnormal_cdf(T x, T e) {
  if constexpr (std::is_same_v<T, float>) return detail::normal_cdf_f32(x, e);
  else return T(0.5) * (T(1) + erf(x));
}

}  // namespace tessera::math
