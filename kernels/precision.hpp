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
#include "kernels/simd.hpp"
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
  // Every case is computed and the right one selected, so that a loop of conversions vectorises.
  const std::uint32_t u = detail::bits_of(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  // Normal: round half to even on bit 13 (a carry bumps the exponent), rebias 127 -> 15.
  const std::uint32_t normal = ((a + 0x0fffu + ((a >> 13) & 1u)) >> 13) - (112u << 10);
  // Below 2^-14: a multiple of 2^-24. Adding 0.5f, whose ulp is 2^-24, rounds |x| to one (ties
  // to even, in the FPU); the low bits of the sum count the units (1024 = the smallest normal).
  // Below 2^-25 that gives 0, as it should.
  const std::uint32_t subnormal = detail::bits_of(detail::float_of(a) + 0.5f) - 0x3f000000u;
  std::uint32_t h = a < 0x38800000u ? subnormal : normal;
  h = a >= 0x477ff000u ? 0x7c00u : h;                                     // >= 65520, inf: inf
  h = a > 0x7f800000u ? 0x7c00u | 0x0200u | ((a >> 13) & 0x03ffu) : h;  // NaN: quiet, top payload
  return std::uint16_t(sign | h);
}

/// \brief The float holding the binary16 value with pattern h (exact).
KOKKOS_INLINE_FUNCTION float from_fp16_bits(std::uint16_t h) {
  // Selects, not branches, as in to_fp16_bits.
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x03ffu;
  const std::uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
  const std::uint32_t special = sign | 0x7f800000u | (m << 13);  // inf, NaN
  // Zero and subnormals: m * 2^-24, exact.
  const std::uint32_t small = sign | detail::bits_of(float(m) * 5.9604644775390625e-8f);
  return detail::float_of(e == 0x1fu ? special : e == 0 ? small : normal);
}

/// \brief x rounded to the nearest binary16, as a float holding that value exactly.
KOKKOS_INLINE_FUNCTION float round_fp16(float x) { return from_fp16_bits(to_fp16_bits(x)); }

/// \brief x rounded to precision p (fp32: x itself).
KOKKOS_INLINE_FUNCTION float round_to(Precision p, float x) {
  return p == Precision::bf16 ? round_bf16(x) : p == Precision::fp16 ? round_fp16(x) : x;
}

namespace detail {

/// Rounds the (rows, cols) block at row stride ld of c in place with `round`: on a CPU one
/// thread per row with a vectorised loop over the columns (no division per element, the
/// precision fixed outside the loop), on a GPU one thread per element.
template <class Round>
void round_rows(const ExecSpace& exec, const char* label, float* c, Index rows, Index cols, Index ld,
                Round round) {
  if constexpr (Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible) {
    Kokkos::parallel_for(label, range(exec, rows), KOKKOS_LAMBDA(const Index i) {
      float* ci = c + i * ld;
      TESSERA_SIMD
      for (Index j = 0; j < cols; ++j) ci[j] = round(ci[j]);
    });
  } else {
    Kokkos::parallel_for(label,
                         Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>(
                             exec, {0, 0}, {rows, cols}),
                         KOKKOS_LAMBDA(const Index i, const Index j) { c[i * ld + j] = round(c[i * ld + j]); });
  }
}

}  // namespace detail

/// \brief A bf16 element (its bit pattern) that takes floats: assigning x stores to_bf16_bits(x).
/// What a kernel's store goes through where it writes a bf16 buffer (stored()).
struct Bf16Ref {
  std::uint16_t& bits;
  KOKKOS_INLINE_FUNCTION void operator=(float x) const { bits = to_bf16_bits(x); }
};

/// \brief What a kernel assigns its result to: the element itself, or for a bf16 buffer
/// (std::uint16_t bit patterns) a Bf16Ref that rounds to bf16 on the way in. So one kernel writes
/// fp32 or bf16 outputs: `stored(y(i, j)) = value;`.
template <class T>
KOKKOS_INLINE_FUNCTION T& stored(T& element) {
  return element;
}
KOKKOS_INLINE_FUNCTION Bf16Ref stored(std::uint16_t& element) { return Bf16Ref{element}; }

/// \brief What a kernel reads of an element: the element itself, or for a bf16 buffer
/// (std::uint16_t bit patterns) its float value; stored()'s counterpart, so one kernel reads fp32
/// or bf16 inputs: `loaded(x(i, j))`.
template <class T>
KOKKOS_INLINE_FUNCTION T loaded(T element) {
  return element;
}
KOKKOS_INLINE_FUNCTION float loaded(std::uint16_t element) { return from_bf16_bits(element); }

/// \brief y = x rounded to bf16 (bit patterns, ties to even).  x (B,N) float, y (B,N)
/// std::uint16_t; rows may be strided.
template <class XView, class YView>
void to_bf16(const ExecSpace& exec, const XView& x, const YView& y) {
  for_rows("tessera::to_bf16", exec, Index(y.extent(0)), Index(y.extent(1)),
           KOKKOS_LAMBDA(const Index i, const Index j) { y(i, j) = to_bf16_bits(x(i, j)); });
}

/// round_bf16 and round_fp16 as function objects, for kernels templated on the rounding.
struct RoundBf16 {
  KOKKOS_INLINE_FUNCTION float operator()(float x) const { return round_bf16(x); }
};
struct RoundFp16 {
  KOKKOS_INLINE_FUNCTION float operator()(float x) const { return round_fp16(x); }
};

/// \brief Rounds the (rows, cols) block of c at row stride ld (>= cols) in place to precision
/// p, as a 16-bit GEMM's output is stored; fp32 launches nothing. c in MemSpace. Enqueued on exec.
inline void round_rows(const ExecSpace& exec, Precision p, float* c, Index rows, Index cols, Index ld) {
  if (p == Precision::bf16) {
    detail::round_rows(exec, "tessera::round_rows::bf16", c, rows, cols, ld, RoundBf16{});
  } else if (p == Precision::fp16) {
    detail::round_rows(exec, "tessera::round_rows::fp16", c, rows, cols, ld, RoundFp16{});
  }
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
