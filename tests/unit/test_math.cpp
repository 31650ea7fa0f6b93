// kernels/math.hpp's vectorisable float exp and normal cdf against double-precision libm: every
// float in their working ranges at a stride of 61 bit patterns (about 35 million exp and 40
// million cdf arguments), the ends of the ranges, and the special values. The bounds are the ones
// the header promises; GELU and its derivative (which hand the cdf the exp they already have)
// are checked the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

// Phi(z) at x = z/sqrt(2) with e = exp(-x^2), both as GELU hands them over (e from vexp of the
// float -x*x), against erfc in double of the same float x: absolute error everywhere, and the
// relative error of the tail Phi(-|z|) while it is a normal float (|x| < 9.1), which 1 + erf(x)
// in float would lose (at z = -4 an absolute error of 1.5e-7 is 0.2% of Phi). The tail's bound
// grows as 6e-8 x^2: the float product x*x that exp is handed is rounded (half an ulp of x^2).
TEST(VectorMath, NormalCdfWithinBoundsEverywhere) {
  double worst_abs = 0.0, worst_rel = 0.0, worst_ratio = 0.0;
  float at_abs = 0.0f, at_rel = 0.0f;
  for_floats(-12.0f, 12.0f, 61, [&](float x) {
    const float e = math::vexp(-x * x);
    const double ref = 0.5 * std::erfc(-double(x));
    const double got = double(math::vnormal_cdf(x, e));
    const double abs = std::abs(got - ref);
    if (abs > worst_abs) worst_abs = abs, at_abs = x;
    if (x < 0.0f && x > -9.1f) {  // the tail: relative error
      const double rel = abs / ref, bound = 5e-7 + 6e-8 * double(x) * double(x);
      if (rel / bound > worst_ratio) worst_ratio = rel / bound, worst_rel = rel, at_rel = x;
    }
  });
  std::printf("normal cdf: worst absolute error %.3g at x = %g; tail relative error %.3g at x = %g (%.2f of its bound)\n",
              worst_abs, double(at_abs), worst_rel, double(at_rel), worst_ratio);
  EXPECT_LE(worst_abs, 2.5e-7) << "at x = " << at_abs;
  EXPECT_LE(worst_ratio, 1.0) << "relative error " << worst_rel << " at x = " << at_rel;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(math::vnormal_cdf(inf, 0.0f), 1.0f);
  EXPECT_EQ(math::vnormal_cdf(-inf, 0.0f), 0.0f);
  EXPECT_EQ(math::vnormal_cdf(30.0f, math::vexp(-900.0f)), 1.0f);
  EXPECT_EQ(math::vnormal_cdf(-30.0f, math::vexp(-900.0f)), 0.0f);
  EXPECT_NEAR(math::vnormal_cdf(0.0f, 1.0f), 0.5f, 1e-7f);
  EXPECT_TRUE(std::isnan(math::vnormal_cdf(std::numeric_limits<float>::quiet_NaN(), 1.0f)));
}

TEST(VectorMath, GeluAndItsDerivativeMatchDouble) {
  double worst_f = 0.0, worst_b = 0.0;
  for_floats(-12.0f, 12.0f, 997, [&](float z) {
    const double g = kernels::gelu(double(z));
    const double d = kernels::gelu_backward_element(double(z), 1.0);
    // Errors relative to the size of the terms: z Phi(z) has absolute error |z| * 1e-7.
    const double scale = 1.0 + std::abs(double(z));
    worst_f = std::max(worst_f, std::abs(double(kernels::gelu(z)) - g) / scale);
    worst_b = std::max(worst_b, std::abs(double(kernels::gelu_backward_element(z, 1.0f)) - d) / scale);
  });
  EXPECT_LE(worst_f, 3e-7);
  EXPECT_LE(worst_b, 3e-7);
}

}  // namespace
