// What `tessera diff` measures per tensor: max|a-b|, the largest finite magnitude, their ratio,
// and how NaN and infinities count. Oracles: hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cli/tensor_diff.hpp"

namespace tessera::cli {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TensorDiff diff_of(const std::vector<float>& a, const std::vector<float>& b) {
  TensorDiff d;
  d.add(a.data(), b.data(), a.size());
  return d;
}

TEST(TensorDiff, EqualTensorsGiveZero) {
  const std::vector<float> a{1.5f, -2.0f, 0.0f, 3e-30f};
  const TensorDiff d = diff_of(a, a);
  EXPECT_EQ(d.max_abs, 0.0);
  EXPECT_EQ(d.max_rel(), 0.0);
  EXPECT_EQ(d.max_scale, 2.0);
  EXPECT_EQ(diff_of({0.0f, 0.0f}, {-0.0f, 0.0f}).max_rel(), 0.0);  // all zeros: 0, not 0/0
}

TEST(TensorDiff, RelativeToTheLargestMagnitudeOfEitherTensor) {
  // |a-b| is largest (0.5) at element 1; the largest magnitude (4) is at element 2.
  const TensorDiff d = diff_of({1.0f, 2.0f, -4.0f}, {1.25f, 2.5f, -4.0f});
  EXPECT_EQ(d.max_abs, 0.5);
  EXPECT_EQ(d.max_scale, 4.0);
  EXPECT_EQ(d.max_rel(), 0.125);
  const TensorDiff e = diff_of({1.0f, 0.0f}, {1.0f, -8.0f});
  EXPECT_EQ(e.max_abs, 8.0);
  EXPECT_EQ(e.max_rel(), 1.0);
  // A tiny element that changes sign does not dominate, as it would elementwise.
  const TensorDiff f = diff_of({1.0f, 1e-8f}, {1.0f, -1e-8f});
  EXPECT_EQ(f.max_rel(), 2.0 * static_cast<double>(1e-8f));
}

TEST(TensorDiff, AccumulatesOverSlabsAndMergesLikeAReduction) {
  const std::vector<float> a{1.0f, 2.0f, 3.0f, 4.0f}, b{1.0f, 2.5f, 3.0f, 3.0f};
  TensorDiff whole = diff_of(a, b), parts;
  parts.add(a.data(), b.data(), 2);
  parts.add(a.data() + 2, b.data() + 2, 2);
  EXPECT_EQ(parts.max_abs, whole.max_abs);
  EXPECT_EQ(parts.max_scale, whole.max_scale);
  EXPECT_EQ(whole.max_abs, 1.0);
  EXPECT_EQ(whole.max_rel(), 0.25);
}

TEST(TensorDiff, NanAndInfinities) {
  // NaN in both at the same place, and the same infinity in both, are equal.
  EXPECT_EQ(diff_of({kNan, kInf, -kInf, 2.0f}, {kNan, kInf, -kInf, 2.0f}).max_abs, 0.0);
  // NaN on one side, opposite infinities, or infinity against a number: infinitely different.
  for (const auto& [x, y] : std::vector<std::pair<float, float>>{{kNan, 1.0f}, {1.0f, kNan}, {kInf, -kInf},
                                                                 {kInf, 1.0f}, {kNan, kInf}}) {
    const TensorDiff d = diff_of({x, 1.0f}, {y, 1.0f});
    EXPECT_EQ(d.max_abs, kInf) << x << " vs " << y;
    EXPECT_EQ(d.max_rel(), kInf) << x << " vs " << y;
  }
  // Non-finite values stay out of the scale; the result is never NaN.
  const TensorDiff d = diff_of({kInf, 2.0f}, {kInf, 3.0f});
  EXPECT_EQ(d.max_scale, 3.0);
  EXPECT_EQ(d.max_rel(), 1.0 / 3.0);
  EXPECT_FALSE(std::isnan(diff_of({kNan}, {kNan}).max_rel()));
}

}  // namespace
}  // namespace tessera::cli
