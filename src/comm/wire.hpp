#pragma once
// The wire type of our own point-to-point algorithms (ring, parameter server, hierarchical): W is
// the data's type T (values travel as they are) or std::uint16_t, bf16 bit patterns of float data
// (comm/bf16.hpp). These helpers move values between the two; with W = T they copy or add.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "comm/bf16.hpp"

namespace tessera::comm {

/// True where values change type on the wire (float data, bf16 wire).
template <class T, class W>
inline constexpr bool kConverts = !std::is_same_v<T, W>;

template <class T, class W>
void encode(const T* in, W* out, std::size_t n) {
  if constexpr (kConverts<T, W>) {
    static_assert(std::is_same_v<T, float> && std::is_same_v<W, std::uint16_t>, "bf16 wire: float data only");
    encode_bf16(in, out, n);
  } else {
    std::copy_n(in, n, out);
  }
}

template <class T, class W>
void decode(const W* in, T* out, std::size_t n) {
  if constexpr (kConverts<T, W>) decode_bf16(in, out, n);
  else std::copy_n(in, n, out);
}

/// out[i] += in[i], in the data's type (an fp32 addition for a bf16 wire).
template <class T, class W>
void add_decoded(const W* in, T* out, std::size_t n) {
  if constexpr (kConverts<T, W>) {
    for (std::size_t i = 0; i < n; ++i) out[i] += from_bf16(in[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
  }
}

/// Rounds n values in place to what the wire can carry (nothing where W = T).
template <class T, class W>
void round_to_wire(T* v, std::size_t n) {
  if constexpr (kConverts<T, W>) round_to_bf16(v, n);
}

}  // namespace tessera::comm
