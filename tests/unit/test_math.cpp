// kernels/math.hpp's vectorisable float exp and erf against double-precision libm: every float
// in their working ranges at a stride of 61 bit patterns (about 35 million exp and 17 million erf
// arguments), the ends of the ranges, and the special values. The bounds are the ones the header
// promises; GELU's backward (which hands erf the exp it already has) is checked the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/activation.hpp"
#include "kernels/math.hpp"

namespace {

using namespace tessera;

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Calls f on every float in [lo, hi] (both finite, lo < hi) at a stride of `stride` bit patterns,
// and on both ends.
template <class F>
void for_floats(float lo, float hi, std::uint32_t stride, F f) {
  // Walk the negative part (descending bits from -0 to lo) and the positive part separately.
  auto walk = [&](float a, float b) {  // 0 <= a < b
    std::uint32_t ua, ub;
    std::memcpy(&ua, &a, sizeof ua);
    std::memcpy(&ub, &b, sizeof ub);
    for (std::uint64_t u = ua; u <= ub; u += stride) f(from_bits(std::uint32_t(u)));
    f(b);
  };
  if (lo < 0.0f) {
    auto neg = [&](float x) { f(-x); };
    const float a = hi < 0.0f ? -hi : 0.0f;
    std::uint32_t ua, ub;
    const float b = -lo;
    std::memcpy(&ua, &a, sizeof ua);
    std::memcpy(&ub, &b, sizeof ub);
    for (std::uint64_t u = ua; u <= ub; u += stride) neg(from_bits(std::uint32_t(u)));
    neg(b);
  }
  if (hi > 0.0f) walk(lo > 0.0f ? lo : 0.0f, hi);
}

TEST(VectorMath, ExpWithinTwoUlpOverTheNormalRange) {
  double worst = 0.0;
  float at = 0.0f;
  // exp(x) is a normal float for x in [-87.33, 88.72].
  for_floats(-87.3f, 88.72f, 61, [&](float x) {
    const double ref = std::exp(double(x));
    const double ulp = std::ldexp(1.0, std::ilogb(ref) - 23);
    const double err = std::abs(double(math::vexp(x)) - ref) / ulp;
    if (err > worst) worst = err, at = x;
  });
  EXPECT_LE(worst, 2.0) << "at x = " << at;
}

TEST(VectorMath, ExpEndsAndSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(math::vexp(0.0f), 1.0f);
  EXPECT_EQ(math::vexp(88.73f), inf);
  EXPECT_EQ(math::vexp(1000.0f), inf);
  EXPECT_EQ(math::vexp(inf), inf);
  EXPECT_EQ(math::vexp(-inf), 0.0f);
  EXPECT_EQ(math::vexp(-105.0f), 0.0f);
  EXPECT_TRUE(std::isnan(math::vexp(std::numeric_limits<float>::quiet_NaN())));
  // Subnormal results stay within a few subnormal steps of the truth.
  for (float x : {-88.0f, -95.0f, -100.0f, -103.0f}) {
    const double ref = std::exp(double(x));
    EXPECT_NEAR(double(math::vexp(x)), ref, 3.0 * std::ldexp(1.0, -149)) << x;
  }
}

TEST(VectorMath, ErfWithinBoundsEverywhere) {
  double worst_abs = 0.0, worst_rel = 0.0;
  float at_abs = 0.0f, at_rel = 0.0f;
  for_floats(-5.0f, 5.0f, 61, [&](float x) {
    const double ref = std::erf(double(x));
    const double got = double(math::verf(x));
    const double abs = std::abs(got - ref);
    if (abs > worst_abs) worst_abs = abs, at_abs = x;
    if (std::abs(x) < 1.0f && std::abs(x) > 1e-37f) {  // normal results: relative error
      const double rel = abs / std::abs(ref);
      if (rel > worst_rel) worst_rel = rel, at_rel = x;
    }
  });
  EXPECT_LE(worst_abs, 1.5e-7) << "at x = " << at_abs;
  EXPECT_LE(worst_rel, 2e-7) << "at x = " << at_rel;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(math::verf(inf), 1.0f);
  EXPECT_EQ(math::verf(-inf), -1.0f);
  EXPECT_EQ(math::verf(30.0f), 1.0f);
  EXPECT_EQ(math::verf(0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(math::verf(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VectorMath, GeluAndItsDerivativeMatchDouble) {
  double worst_f = 0.0, worst_b = 0.0;
  for_floats(-12.0f, 12.0f, 997, [&](float z) {
    const double g = kernels::gelu(double(z));
    const double d = kernels::gelu_backward_element(double(z), 1.0);
    // Errors relative to the size of the terms: z/2 (1 + erf) has absolute error |z|/2 * 1.5e-7.
    const double scale = 1.0 + std::abs(double(z));
    worst_f = std::max(worst_f, std::abs(double(kernels::gelu(z)) - g) / scale);
    worst_b = std::max(worst_b, std::abs(double(kernels::gelu_backward_element(z, 1.0f)) - d) / scale);
  });
  EXPECT_LE(worst_f, 3e-7);
  EXPECT_LE(worst_b, 3e-7);
}

}  // namespace
