#pragma once
// Analytic gradients against central finite differences, in double precision: shared by the
// gradient checks of every layer and kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/views.hpp"

namespace tessera::test {

inline constexpr double fd_eps = 1e-6;
inline constexpr double max_error = 1e-6;

using Flat = VectorU<double>;

inline double get(const Flat& v, std::size_t i) {
  double x = 0;
  Kokkos::deep_copy(x, Kokkos::subview(v, i));
  return x;
}
inline void set(const Flat& v, std::size_t i, double x) { Kokkos::deep_copy(Kokkos::subview(v, i), x); }

/// Central difference of loss() in element i of v, restoring it afterwards.
inline double finite_difference(const Flat& v, std::size_t i, const std::function<double()>& loss) {
  const double x = get(v, i);
  set(v, i, x + fd_eps);
  const double up = loss();
  set(v, i, x - fd_eps);
  const double down = loss();
  set(v, i, x);
  return (up - down) / (2 * fd_eps);
}

/// Compares every element of `analytic` with finite differences of loss() through `v`.
/// The error is relative to max(1, |analytic|), so tiny gradients are held to an absolute bound.
inline void expect_gradient(const char* what, const Flat& v, const std::vector<double>& analytic,
                            const std::function<double()>& loss) {
  ASSERT_EQ(v.extent(0), analytic.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    const double fd = finite_difference(v, i, loss);
    const double err = std::abs(fd - analytic[i]) / std::max(1.0, std::abs(analytic[i]));
    worst = std::max(worst, err);
    EXPECT_LT(err, max_error) << what << "[" << i << "]: analytic " << analytic[i] << ", fd " << fd;
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace tessera::test
