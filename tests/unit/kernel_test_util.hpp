#pragma once
// Helpers for kernel and layer tests: random host data, host <-> MemSpace copies.
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "kernels/views.hpp"

namespace tessera::test {

template <class T>
std::vector<T> random_vector(std::size_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(dist(gen));
  return v;
}

template <class T>
Vector<T> to_device(const std::vector<T>& h, const std::string& label = "test::vector") {
  Vector<T> d(label, h.size());
  auto mirror = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < h.size(); ++i) mirror(i) = h[i];
  Kokkos::deep_copy(d, mirror);
  return d;
}

template <class T>
Matrix<T> to_device(const std::vector<T>& h, std::size_t rows, std::size_t cols,
                    const std::string& label = "test::matrix") {
  Matrix<T> d(label, rows, cols);
  auto mirror = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) mirror(i, j) = h[i * cols + j];
  Kokkos::deep_copy(d, mirror);
  return d;
}

/// Row-major host copy of a rank-1 or rank-2 view.
template <class View>
std::vector<typename View::non_const_value_type> to_host(const View& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  std::vector<typename View::non_const_value_type> out;
  if constexpr (View::rank == 1) {
    for (std::size_t i = 0; i < h.extent(0); ++i) out.push_back(h(i));
  } else {
    for (std::size_t i = 0; i < h.extent(0); ++i)
      for (std::size_t j = 0; j < h.extent(1); ++j) out.push_back(h(i, j));
  }
  return out;
}

/// Tolerance for comparing a kernel with a host reference computed in double.
template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-13;
}

}  // namespace tessera::test
