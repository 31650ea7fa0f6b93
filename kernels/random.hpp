#pragma once
// Counter-based random numbers: every value is a pure function of (seed, stream, index), so a
// parameter's initial values do not depend on the rank count, the layout or the order in which
// anything was created (DESIGN.md, "The invariant"). The stream of a parameter is the FNV-1a
// hash of its name.
//
// Mixing: splitmix64's finaliser (Steele, Lea, Flood 2014), applied three times in a chain
//   h = mix(mix(mix(seed) ^ stream) ^ index),
// a bijection at each stage, so distinct indices in one (seed, stream) never collide.
#include <cstdint>
#include <string_view>

#include "kernels/math.hpp"

namespace tessera::kernels {

/// FNV-1a, 64-bit: the stream of a named parameter.
constexpr std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : name) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// splitmix64: add the golden-ratio increment, then the finaliser.
KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// 64 random bits for (seed, stream, index).
KOKKOS_INLINE_FUNCTION std::uint64_t random_bits(std::uint64_t seed, std::uint64_t stream,
                                                 std::uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

/// Uniform in [0, 1) with 53 random bits.
KOKKOS_INLINE_FUNCTION double uniform01(std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t index) {
  return double(random_bits(seed, stream, index) >> 11) * 0x1.0p-53;
}

/// Standard normal by Box-Muller from the counters 2 index and 2 index + 1.
KOKKOS_INLINE_FUNCTION double normal(std::uint64_t seed, std::uint64_t stream,
                                     std::uint64_t index) {
  const double u1 = 1.0 - uniform01(seed, stream, 2 * index);  // (0, 1]: log is finite
  const double u2 = uniform01(seed, stream, 2 * index + 1);
  const double two_pi = 6.28318530717958647692;
  return math::sqrt(-2.0 * math::log(u1)) * math::cos(two_pi * u2);
}

}  // namespace tessera::kernels
