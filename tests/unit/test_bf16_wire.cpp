// The bf16 of the wire (comm/bf16.hpp): round to nearest, ties to even, checked exactly on chosen
// values (ties both ways, a carry into the exponent, overflow, signed zero, NaN), and the same
// bits as the mixed-precision conversion of kernels/precision.hpp on a sweep of values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "comm/bf16.hpp"
#include "kernels/precision.hpp"

namespace tessera::comm {
namespace {

TEST(Bf16Wire, RoundsToNearestTiesToEven) {
  // Around 1 the bf16 spacing is 2^-7.
  EXPECT_EQ(from_bf16(to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 0x1p-8f)), 1.0f);                   // tie, down to even
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);     // tie, up to even
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);  // above the tie
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 0x1p-8f - 0x1p-20f)), 1.0f);         // below the tie
  EXPECT_EQ(from_bf16(to_bf16(-3.0f - 0x1p-7f)), -3.0f);                   // tie at 2..4 (spacing 2^-6)
  EXPECT_EQ(from_bf16(to_bf16(2.0f - 0x1p-9f)), 2.0f);                     // carry into the exponent
  EXPECT_EQ(from_bf16(to_bf16(0.1f)), 0.10009765625f);
}

TEST(Bf16Wire, EdgeValues) {
  EXPECT_EQ(to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(from_bf16(to_bf16(0x1.fep127f)), 0x1.fep127f);  // the largest bf16
  EXPECT_TRUE(std::isinf(from_bf16(to_bf16(std::numeric_limits<float>::max()))));
  EXPECT_EQ(from_bf16(to_bf16(-std::numeric_limits<float>::infinity())), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not turn into inf.
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::bit_cast<float>(0x7f800001u)))));
}

TEST(Bf16Wire, SameBitsAsTheMixedPrecisionConversion) {
  std::uint32_t u = 12345;
  for (int i = 0; i < 200000; ++i) {
    u = u * 1664525u + 1013904223u;
    const float x = std::bit_cast<float>(u);
    ASSERT_EQ(to_bf16(x), kernels::to_bf16_bits(x)) << std::hexfloat << x;
  }
  float buf[3] = {1.0f + 0x1p-8f, -2.5f, 1e-3f};
  std::uint16_t wire[3];
  float back[3];
  encode_bf16(buf, wire, 3);
  decode_bf16(wire, back, 3);
  round_to_bf16(buf, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back[i], buf[i]);
}

}  // namespace
}  // namespace tessera::comm
