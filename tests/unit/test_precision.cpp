// kernels/precision.hpp against bit-level references: a rounding reference computed in double
// (nearbyint on the value scaled to the target's quantum, so ties go to even), every 16-bit
// pattern, every tie between neighbouring 16-bit values and the floats one ulp either side,
// named edge cases with their expected bits, and GCC's own _Float16 conversions where the
// compiler has them (GCC 12 on x86-64).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/precision.hpp"

namespace {

using namespace tessera;
namespace k = tessera::kernels;

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// A binary float format with `mantissa` stored bits, smallest normal exponent `emin` and
/// largest finite value `max_finite`: x rounded to it, ties to even, computed in double.
float reference_round(float x, int mantissa, int emin, double max_finite) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  int e = 0;
  std::frexp(double(x), &e);  // |x| in [2^(e-1), 2^e)
  const int exponent = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, exponent - mantissa);
  const double r = std::nearbyint(double(x) / quantum) * quantum;  // FE_TONEAREST: ties to even
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<float>::infinity(), x);
  if (r == 0.0) return std::copysign(0.0f, x);
  return float(r);
}
float reference_bf16(float x) { return reference_round(x, 7, -126, 0x1.fep127); }
float reference_fp16(float x) { return reference_round(x, 10, -14, 65504.0); }

/// Same value and sign, or both NaN.
bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return bits(a) == bits(b);
}

void expect_bf16(float x) {
  const float ref = reference_bf16(x);
  const std::uint16_t h = k::to_bf16_bits(x);
  ASSERT_TRUE(same(k::from_bf16_bits(h), ref))
      << std::hexfloat << "x = " << x << " (0x" << std::hex << bits(x) << "): bf16 0x" << h
      << ", reference " << ref;
  if (!std::isnan(x)) {
    ASSERT_EQ(std::uint32_t(h) << 16, bits(ref)) << std::hexfloat << x;
  }
  ASSERT_TRUE(same(k::round_bf16(x), ref));
}

void expect_fp16(float x) {
  const float ref = reference_fp16(x);
  const std::uint16_t h = k::to_fp16_bits(x);
  ASSERT_TRUE(same(k::round_fp16(x), ref)) << std::hexfloat << "x = " << x << " (0x" << std::hex
                                           << bits(x) << "): fp16 0x" << h << ", reference " << ref;
  ASSERT_TRUE(same(k::from_fp16_bits(h), ref));
#if defined(__FLT16_MAX__)
  const _Float16 g = static_cast<_Float16>(x);
  std::uint16_t gbits;
  std::memcpy(&gbits, &g, sizeof gbits);
  if (std::isnan(x)) {
    ASSERT_EQ(h & 0x7c00u, 0x7c00u);
    ASSERT_NE(h & 0x03ffu, 0u);
    ASSERT_EQ(h & 0x8000u, bits(x) >> 16 & 0x8000u);
  } else {
    ASSERT_EQ(h, gbits) << std::hexfloat << "x = " << x << " _Float16 gives 0x" << std::hex
                        << gbits;
  }
#endif
}

TEST(Bf16, NamedCasesHaveTheirBits) {
  struct Case {
    std::uint32_t x;
    std::uint16_t bf16;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80u},  // 1
      {0x3f808000u, 0x3f80u},  // 1 + 2^-8: tie, down to the even 1
      {0x3f818000u, 0x3f82u},  // 1 + 3 2^-8: tie, up to the even 1 + 2^-6
      {0x3f808001u, 0x3f81u},  // just above the tie
      {0x3f807fffu, 0x3f80u},  // just below the tie
      {0xbf808001u, 0xbf81u},  // negative values round by magnitude
      {0x7f7f0000u, 0x7f7fu},  // max finite bf16
      {0x7f7f7fffu, 0x7f7fu},  // below the tie past it
      {0x7f7f8000u, 0x7f80u},  // tie past max finite: the even neighbour is inf
      {0x7f7fffffu, 0x7f80u},  // FLT_MAX overflows
      {0xff7fffffu, 0xff80u},  // -FLT_MAX overflows to -inf
      {0x7f800000u, 0x7f80u},  // inf
      {0xff800000u, 0xff80u},  // -inf
      {0x00000000u, 0x0000u},  // +0
      {0x80000000u, 0x8000u},  // -0 keeps its sign
      {0x00800000u, 0x0080u},  // smallest normal float
      {0x00000001u, 0x0000u},  // smallest subnormal float rounds to 0
      {0x00008000u, 0x0000u},  // subnormal tie, to the even 0
      {0x00018000u, 0x0002u},  // subnormal tie, to the even 2
      {0x807fffffu, 0x8080u},  // largest negative subnormal rounds up to -(smallest normal)
  };
  for (const Case& c : cases) {
    EXPECT_EQ(k::to_bf16_bits(from_bits(c.x)), c.bf16) << std::hex << "x = 0x" << c.x;
    expect_bf16(from_bits(c.x));
  }
}

TEST(Bf16, NaNStaysNaNWithItsSign) {
  // 0x7f800001 and 0x7f80ffff would round to inf (or carry further) if treated as numbers.
  for (std::uint32_t x :
       {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xffc00000u, 0xff800001u}) {
    const std::uint16_t h = k::to_bf16_bits(from_bits(x));
    EXPECT_EQ(h & 0x7f80u, 0x7f80u) << std::hex << x;
    EXPECT_NE(h & 0x007fu, 0u) << std::hex << x;
    EXPECT_EQ(h & 0x8000u, (x >> 16) & 0x8000u) << std::hex << x;
    EXPECT_TRUE(std::isnan(k::round_bf16(from_bits(x))));
  }
}

TEST(Bf16, EveryPatternAndEveryTieBetweenNeighbours) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const float v = from_bits(h << 16);
    if (!std::isnan(v)) {  // exact values stay
      ASSERT_EQ(k::to_bf16_bits(v), h) << std::hex << h;
    }
    ASSERT_EQ(bits(k::from_bf16_bits(std::uint16_t(h))), h << 16);
    if ((h & 0x7fffu) >= 0x7f80u) continue;  // inf, NaN: no upper neighbour
    // The midpoint to the next pattern (away from zero) and one float ulp either side.
    const std::uint32_t mid = (h << 16) | 0x8000u;
    for (std::uint32_t x : {mid - 1, mid, mid + 1}) expect_bf16(from_bits(x));
  }
}

TEST(Bf16, RandomBitPatterns) {
  std::mt19937 gen(7);
  for (int i = 0; i < 1 << 20; ++i) expect_bf16(from_bits(gen()));
}

TEST(Fp16, NamedCasesHaveTheirBits) {
  struct Case {
    float x;
    std::uint16_t fp16;
  };
  const Case cases[] = {
      {1.0f, 0x3c00u},
      {0x1.002p0f, 0x3c00u},     // 1 + 2^-11: tie, down to the even 1
      {0x1.006p0f, 0x3c02u},     // 1 + 3 2^-11: tie, up to the even 1 + 2^-9
      {0x1.002002p0f, 0x3c01u},  // just above the tie
      {0.1f, 0x2e66u},
      {-2.0f, 0xc000u},
      {65504.0f, 0x7bffu},        // max finite
      {0x1.ffdffep15f, 0x7bffu},  // the float below 65520
      {65520.0f, 0x7c00u},        // tie past max finite: the even neighbour is inf
      {65536.0f, 0x7c00u},
      {-65520.0f, 0xfc00u},
      {1e10f, 0x7c00u},
      {0x1p-14f, 0x0400u},         // smallest normal
      {0x1.ffcp-15f, 0x0400u},     // 1023.5 2^-24: tie, up to the even smallest normal
      {0x1.ff8p-15f, 0x03ffu},     // 1023 2^-24: the largest subnormal is exact
      {0x1.ff4p-15f, 0x03feu},     // 1022.5 2^-24: tie, down to the even 1022
      {0x1p-24f, 0x0001u},         // smallest subnormal
      {0x1p-25f, 0x0000u},         // half of it: tie, down to the even 0
      {0x1.000002p-25f, 0x0001u},  // just above that tie
      {0x1.8p-24f, 0x0002u},       // 1.5 2^-24: tie, up to the even 2
      {0x1.4p-24f, 0x0001u},       // 1.25 2^-24
      {0x1p-26f, 0x0000u},
      {-0x1p-26f, 0x8000u},  // underflow keeps the sign
      {1e-30f, 0x0000u},
      {0x1p-149f, 0x0000u},  // smallest float subnormal
      {0.0f, 0x0000u},
      {-0.0f, 0x8000u},
      {std::numeric_limits<float>::infinity(), 0x7c00u},
      {-std::numeric_limits<float>::infinity(), 0xfc00u},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(k::to_fp16_bits(c.x), c.fp16) << std::hexfloat << "x = " << c.x;
    expect_fp16(c.x);
  }
}

TEST(Fp16, NaNStaysNaNWithItsSign) {
  for (std::uint32_t x :
       {0x7fc00000u, 0x7f800001u, 0x7f801fffu, 0x7fffffffu, 0xffc00000u, 0xff800001u}) {
    const std::uint16_t h = k::to_fp16_bits(from_bits(x));
    EXPECT_EQ(h & 0x7c00u, 0x7c00u) << std::hex << x;
    EXPECT_NE(h & 0x03ffu, 0u) << std::hex << x;
    EXPECT_EQ(h & 0x8000u, (x >> 16) & 0x8000u) << std::hex << x;
    EXPECT_TRUE(std::isnan(k::round_fp16(from_bits(x))));
  }
}

TEST(Fp16, EveryPatternAndEveryTieBetweenNeighbours) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const float v = k::from_fp16_bits(std::uint16_t(h));
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
    ASSERT_EQ(std::isnan(v), nan) << std::hex << h;
    if (nan) continue;
    // Decoding against ldexp, and exact values encode back to themselves.
    const int e = int(h >> 10 & 0x1fu), m = int(h & 0x3ffu);
    const double magnitude = e == 0x1f ? HUGE_VAL
                             : e == 0  ? std::ldexp(m, -24)
                                       : std::ldexp(1024 + m, e - 25);
    ASSERT_EQ(double(v), (h & 0x8000u) ? -magnitude : magnitude) << std::hex << h;
    ASSERT_EQ(k::to_fp16_bits(v), h) << std::hex << h;
#if defined(__FLT16_MAX__)
    _Float16 g;
    std::memcpy(&g, &h, sizeof g);
    ASSERT_EQ(bits(v), bits(float(g))) << std::hex << h;
#endif
    if ((h & 0x7fffu) >= 0x7c00u) continue;
    // The midpoint to the next value away from zero and one float ulp either side. The next
    // value of 65504 is 65536 here: the midpoint 65520 is the overflow threshold.
    const double next =
        (h & 0x7fffu) == 0x7bffu
            ? 65536.0
            : double(std::fabs(k::from_fp16_bits(std::uint16_t((h & 0x7fffu) + 1))));
    const float mid = float((std::fabs(double(v)) + next) / 2.0);
    ASSERT_EQ(double(mid), (std::fabs(double(v)) + next) / 2.0);  // exact in float
    const std::uint32_t mb = bits(mid) | (h & 0x8000u) << 16;
    for (std::uint32_t x : {mb - 1, mb, mb + 1}) expect_fp16(from_bits(x));
  }
}

TEST(Fp16, RandomBitPatternsAndRandomValuesInRange) {
  std::mt19937 gen(11);
  for (int i = 0; i < 1 << 20; ++i) expect_fp16(from_bits(gen()));
  // Values inside fp16's range, where the random patterns above are sparse.
  std::uniform_real_distribution<float> exponent(-27.0f, 17.0f);
  for (int i = 0; i < 1 << 20; ++i) {
    const float x = std::exp2(exponent(gen)) * ((gen() & 1) ? -1.0f : 1.0f);
    expect_fp16(x);
  }
}

TEST(RoundTo, KernelMatchesTheScalarFunctionsAndFp32LeavesBitsAlone) {
  std::vector<float> h = test::random_vector<float>(4099, 3, -70000.0, 70000.0);
  std::mt19937 gen(5);
  for (int i = 0; i < 1000; ++i) h[std::size_t(gen() % h.size())] = from_bits(gen());  // any bits
  h[0] = from_bits(0x7f800001u);  // a signaling NaN: fp32 must not touch its payload
  h[1] = -0.0f;
  h[2] = 1e-30f;
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(p));
    auto d = test::to_device(h);
    k::round_to(ExecSpace(), p, d);
    const std::vector<float> out = test::to_host(d);
    for (std::size_t i = 0; i < h.size(); ++i) {
      const float want = p == Precision::bf16   ? k::round_bf16(h[i])
                         : p == Precision::fp16 ? k::round_fp16(h[i])
                                                : h[i];
      if (p == Precision::fp32) {
        ASSERT_EQ(bits(out[i]), bits(h[i])) << i;
      } else {
        ASSERT_TRUE(same(out[i], want)) << i;
        ASSERT_TRUE(same(k::round_to(p, h[i]), want)) << i;
      }
    }
  }
}

TEST(RoundTo, RankTwoViewsAndIdempotence) {
  const std::vector<float> h = test::random_vector<float>(6 * 7, 9, -3.0, 3.0);
  auto d = test::to_device(h, 6, 7);
  k::round_to(ExecSpace(), Precision::bf16, d);
  const std::vector<float> once = test::to_host(d);
  for (std::size_t i = 0; i < h.size(); ++i) EXPECT_EQ(bits(once[i]), bits(k::round_bf16(h[i])));
  k::round_to(ExecSpace(), Precision::bf16, d);  // rounding a rounded value changes nothing
  EXPECT_EQ(test::to_host(d), once);
  k::round_to(ExecSpace(), Precision::fp16, d);
  for (float v : test::to_host(d)) EXPECT_EQ(bits(v), bits(k::round_fp16(v)));
}

TEST(RoundRows, StridedBlockMatchesTheScalarFunctionsAndLeavesThePaddingAlone) {
  // A GEMM's output block: 37 rows of 45 columns at stride 64, in a buffer of 40 x 64. The
  // vectorised CPU loop has remainders (45 is no multiple of a vector); NaNs, infinities and
  // values near the formats' limits are spread over it.
  const Index rows = 37, cols = 45, ld = 64;
  std::vector<float> h = test::random_vector<float>(std::size_t(40 * ld), 11, -70000.0, 70000.0);
  std::mt19937 gen(13);
  for (int i = 0; i < 400; ++i) h[std::size_t(gen() % h.size())] = from_bits(gen());  // any bits
  h[1] = from_bits(0x7f800001u);
  h[2] = -0.0f;
  h[3] = 65520.0f;
  h[4] = 3e-8f;
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(precision_name(p));
    auto d = test::to_device(h);
    k::round_rows(ExecSpace(), p, d.data(), rows, cols, ld);
    const std::vector<float> out = test::to_host(d);
    for (std::size_t e = 0; e < h.size(); ++e) {
      const bool inside = Index(e) / ld < rows && Index(e) % ld < cols;
      if (!inside || p == Precision::fp32) {
        ASSERT_EQ(bits(out[e]), bits(h[e])) << e;
      } else {
        ASSERT_TRUE(same(out[e], k::round_to(p, h[e]))) << e;
      }
    }
  }
}

TEST(AllFinite, FindsEveryKindOfNonFiniteValue) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> base = {
      1.0f,   -0.0f,   std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
      1e-45f, 65504.0f};
  EXPECT_TRUE(k::all_finite(ExecSpace(), test::to_device(base)));
  EXPECT_TRUE(k::all_finite(ExecSpace(), test::to_device(std::vector<float>{})));
  for (float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN(), from_bits(0xff800001u)}) {
    for (std::size_t at : {std::size_t(0), base.size() / 2, base.size()}) {
      std::vector<float> v = base;
      v.insert(v.begin() + std::ptrdiff_t(at), bad);
      EXPECT_FALSE(k::all_finite(ExecSpace(), test::to_device(v))) << bad << " at " << at;
    }
  }
  // What makes fp16 need loss scaling: 70000 is finite in fp32 and bf16, inf in fp16.
  std::vector<float> big = {1.0f, 70000.0f};
  auto d = test::to_device(big);
  k::round_to(ExecSpace(), Precision::bf16, d);
  EXPECT_TRUE(k::all_finite(ExecSpace(), d));
  k::round_to(ExecSpace(), Precision::fp16, d);
  EXPECT_FALSE(k::all_finite(ExecSpace(), d));
}

}  // namespace
