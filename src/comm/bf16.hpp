#pragma once
// bf16 on the wire (comm.reduce_dtype = "bf16"): an fp32 value rounded to its top 16 bits (1 sign,
// 8 exponent, 7 mantissa bits), round to nearest, ties to even, exactly as kernels/precision.hpp's
// to_bf16_bits does for mixed precision (comm/ does not include kernels/; tests/unit/test_bf16_wire
// checks that both agree). Overflow rounds to +-inf, NaN stays a quiet NaN, -0 stays -0.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tessera::comm {

/// \brief The bit pattern of the bf16 nearest to x (ties to even).
inline std::uint16_t to_bf16(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  // Both results computed and one selected, so that a loop of conversions vectorises.
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // a carry may reach inf
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/// \brief The float holding the bf16 value with pattern h (exact).
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float x = 0;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// \brief out[i] = to_bf16(in[i]) for n values.
inline void encode_bf16(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

/// \brief out[i] = from_bf16(in[i]) for n values.
inline void decode_bf16(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = from_bf16(in[i]);
}

/// \brief Rounds n floats in place to the bf16 nearest to each (they stay floats).
inline void round_to_bf16(float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) v[i] = from_bf16(to_bf16(v[i]));
}

}  // namespace tessera::comm
