#pragma once
// The discrete operator of -div(a grad u) on a uniform grid of H x W interior nodes of the unit
// square (node (i, j) at x = (j+1) hx, y = (i+1) hy; hx = 1/(W+1), hy = 1/(H+1)), u = 0 on the
// boundary, the five-point finite-volume stencil with a sampled at the faces:
//   (A u)_ij = [ax_i,j+1 (u_ij - u_i,j+1) + ax_ij (u_ij - u_i,j-1)] / hx^2
//            + [ay_i+1,j (u_ij - u_i+1,j) + ay_ij (u_ij - u_i-1,j)] / hy^2
// ax_ij = a((j + 1/2) hx, (i+1) hy): the face left of node (i, j); ay_ij = a((j+1) hx, (i + 1/2) hy):
// the face below it. Second order for smooth a. A rank holds rows [r0, r0 + rows) of every array
// (spatial parallelism): u with one halo row on each side, the faces of its rows. Plus the
// vector operations of preconditioned conjugate gradients. Double precision.
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief out (rows, W) = A u. u (rows+2, W): row 0 and row rows+1 are the neighbours' rows (zero at
/// the field's edges); ax (rows, W+1); ay (rows+1, W). sx = 1/hx^2, sy = 1/hy^2.
template <class T>
void darcy_apply(const ExecSpace& exec, Index rows, Index W, const T* u, const T* ax, const T* ay, T sx, T sy,
                 T* out) {
  Kokkos::parallel_for(
      "tessera::darcy_apply", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, rows * W),
      KOKKOS_LAMBDA(const Index e) {
        const Index i = e / W, j = e % W;
        const T c = u[(i + 1) * W + j];
        const T west = j > 0 ? u[(i + 1) * W + j - 1] : T(0);
        const T east = j + 1 < W ? u[(i + 1) * W + j + 1] : T(0);
        const T north = u[i * W + j], south = u[(i + 2) * W + j];
        out[e] = sx * (ax[i * (W + 1) + j + 1] * (c - east) + ax[i * (W + 1) + j] * (c - west)) +
                 sy * (ay[(i + 1) * W + j] * (c - south) + ay[i * W + j] * (c - north));
      });
}

/// \brief d (rows, W) = the diagonal of A (Jacobi preconditioner).
template <class T>
void darcy_diagonal(const ExecSpace& exec, Index rows, Index W, const T* ax, const T* ay, T sx, T sy, T* d) {
  Kokkos::parallel_for(
      "tessera::darcy_diagonal", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, rows * W),
      KOKKOS_LAMBDA(const Index e) {
        const Index i = e / W, j = e % W;
        d[e] = sx * (ax[i * (W + 1) + j + 1] + ax[i * (W + 1) + j]) + sy * (ay[(i + 1) * W + j] + ay[i * W + j]);
      });
}

/// \brief sum_i x_i y_i over n values.
template <class T>
double dot(const ExecSpace& exec, const T* x, const T* y, Index n) {
  double sum = 0.0;
  Kokkos::parallel_reduce(
      "tessera::dot", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i, double& acc) { acc += double(x[i]) * double(y[i]); }, sum);
  return sum;
}

/// \brief y = a x + b y over n values.
template <class T>
void axpby(const ExecSpace& exec, T a, const T* x, T b, T* y, Index n) {
  Kokkos::parallel_for(
      "tessera::axpby", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i) { y[i] = a * x[i] + b * y[i]; });
}

/// \brief z = r / d element-wise over n values.
template <class T>
void divide(const ExecSpace& exec, const T* r, const T* d, T* z, Index n) {
  Kokkos::parallel_for(
      "tessera::divide", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i) { z[i] = r[i] / d[i]; });
}

}  // namespace tessera::kernels
