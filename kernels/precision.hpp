#pragma once
// Rounding fp32 values to the 16-bit formats of mixed precision, element by element:
//   bf16: 1 sign, 8 exponent, 7 mantissa bits (fp32's range, 2^-8 relative spacing);
//   fp16: IEEE binary16, 1 sign, 5 exponent, 10 mantissa bits (max finite 65504, smallest
//         normal 2^-14, smallest subnormal 2^-24).
// Both round to nearest, ties to even, the way hardware conversions (cvtneps2bf16, cvtps2ph,
// __float2bfloat16_rn, __float2half_rn) do. A "rounded" float holds the 16-bit value exactly,
// so fp32 arithmetic on rounded values sees exactly the 16-bit operands.
// The finiteness check of loss scaling is kernels::all_finite (kernels/reduce.hpp, included).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/precision.hpp"
#include "kernels/reduce.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

namespace detail {

/// The bits of a float and back (memcpy, as Kokkos::bit_cast does; Kokkos 3.4 has no bit_cast).
KOKKOS_INLINE_FUNCTION std::uint32_t bits_of(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
KOKKOS_INLINE_FUNCTION float float_of(std::uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace detail

/// \brief The bf16 nearest to x (ties to even) as its 16-bit pattern: the top half of x's bits
/// after rounding. Overflow rounds to +-inf (beyond 0x1.fep127 + half a bf16 step), NaN stays a
/// (quiet) NaN with x's sign, -0 stays -0, fp32 subnormals round like any other value.
KOKKOS_INLINE_FUNCTION std::uint16_t to_bf16_bits(float x) {
  std::uint32_t u = detail::bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on bit 16; a carry may reach inf
  return std::uint16_t(u >> 16);
}

/// \brief The float holding the bf16 value with pattern h (exact).
KOKKOS_INLINE_FUNCTION float from_bf16_bits(std::uint16_t h) {
  return detail::float_of(std::uint32_t(h) << 16);
}

/// \brief x rounded to the nearest bf16, as a float.
KOKKOS_INLINE_FUNCTION float round_bf16(float x) { return from_bf16_bits(to_bf16_bits(x)); }

/// \brief The IEEE binary16 nearest to x (ties to even) as its 16-bit pattern. |x| >= 65520
/// (halfway from 65504 to 2^16) gives +-inf, |x| < 2^-14 gives a subnormal or +-0, NaN a quiet
/// NaN with x's sign and top payload bits, -0 stays -0.
KOKKOS_INLINE_FUNCTION std::uint16_t to_fp16_bits(float x) {
  const std::uint32_t u = detail::bits_of(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or NaN
    return std::uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x0200u | ((a >> 13) & 0x03ffu) : 0u));
  }
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520: overflow
  if (a < 0x38800000u) {  // below 2^-14: subnormal in fp16, value m * 2^(e - 150)
    const std::uint32_t e = a >> 23;
    if (e < 102) return std::uint16_t(sign);  // below 2^-25: rounds to zero
    const std::uint32_t m = (a & 0x007fffffu) | 0x00800000u;
    const std::uint32_t shift = 126u - e;  // 14 ... 24: result in units of 2^-24
    std::uint32_t h = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) ++h;  // may carry into the smallest normal
    return std::uint16_t(sign | h);
  }
  a += 0x0fffu + ((a >> 13) & 1u);  // round half to even on bit 13; a carry bumps the exponent
  return std::uint16_t(sign | ((a >> 13) - (112u << 10)));  // rebias the exponent: 127 -> 15
}

/// \brief The float holding the binary16 value with pattern h (exact).
KOKKOS_INLINE_FUNCTION float from_fp16_bits(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x03ffu;
  if (e == 0x1fu) return detail::float_of(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e == 0) {                                                             // zero, subnormal
    const float magnitude = float(m) * 5.9604644775390625e-8f;              // m * 2^-24, exact
    return sign ? -magnitude : magnitude;
  }
  return detail::float_of(sign | ((e + 112u) << 23) | (m << 13));
}

/// \brief x rounded to the nearest binary16, as a float holding that value exactly.
KOKKOS_INLINE_FUNCTION float round_fp16(float x) { return from_fp16_bits(to_fp16_bits(x)); }

/// \brief x rounded to precision p (fp32: x itself).
KOKKOS_INLINE_FUNCTION float round_to(Precision p, float x) {
  return p == Precision::bf16 ? round_bf16(x) : p == Precision::fp16 ? round_fp16(x) : x;
}

/// \brief Rounds every element of x in place to precision p; fp32 leaves x untouched (no kernel).
/// x (n) or a contiguous (rows, cols) float view in MemSpace. Enqueued on exec.
template <class View>
void round_to(const ExecSpace& exec, Precision p, const View& x) {
  static_assert(std::is_same_v<typename View::value_type, float>,
                "tessera::kernels::round_to rounds float views");
  if constexpr (View::rank == 2) {
    round_to(exec, p, flat(x));
  } else {
    static_assert(View::rank == 1, "tessera::kernels::round_to takes a rank-1 or rank-2 view");
    if (p == Precision::bf16) {
      Kokkos::parallel_for(
          "tessera::round_to::bf16", range(exec, Index(x.extent(0))),
          KOKKOS_LAMBDA(const Index i) { x(i) = round_bf16(x(i)); });
    } else if (p == Precision::fp16) {
      Kokkos::parallel_for(
          "tessera::round_to::fp16", range(exec, Index(x.extent(0))),
          KOKKOS_LAMBDA(const Index i) { x(i) = round_fp16(x(i)); });
    }
  }
}

}  // namespace tessera::kernels
