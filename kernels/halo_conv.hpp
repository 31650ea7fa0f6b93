#pragma once
// Convolution over a block of rows of each sample (spatial parallelism: a rank holds rows
// [r0, r0 + h) of every H x W field), by im2col + GEMM as kernels/conv2d.hpp, with the rows
// beyond the block taken from halo buffers its neighbours sent instead of zero padding:
//   x      (B, C, h, W)  this rank's rows
//   top    (B, C, P, W)  rows r0-P .. r0-1 (the rank above's last P rows), or null: zeros
//   bottom (B, C, P, W)  rows r0+h .. r0+h+P-1 (the rank below's first P rows), or null: zeros
// Columns are zero-padded (the block holds whole rows). Deterministic, no atomics:
//   im2col_rows  one thread per (sample, column row, output position) of the rows asked for
//   col2im_rows  one thread per element of x and of the halos, gathering the k*k positions that
//                read it (the halos' gradients go back to the ranks that own those rows)
//   pack_rows / add_rows  copy P rows of each (sample, channel) plane out, or add them in
#include "kernels/conv2d.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief col (B, C*k*k, h*W) at output rows [y0, y1) only (positions [y0*W, y1*W)):
/// col[b][(c*k + ky)*k + kx][y*W + x] = x[b][c][y + ky - P][x + kx - P], the row from the block,
/// top or bottom, zero outside the field. s.height is the block's rows h, s.pad is P (<= h).
template <class T>
void im2col_rows(const ExecSpace& exec, const ConvShape& s, const T* x, const T* top, const T* bottom,
                 T* col, Index batch, Index y0, Index y1) {
  const Index K = s.kernel, P = s.pad, H = s.height, W = s.width, rows = s.rows(), pos = s.positions();
  const Index img = s.channels * H * W, halo = s.channels * P * W, n = (y1 - y0) * W;
  if (n <= 0) return;
  Kokkos::parallel_for(
      "tessera::im2col_rows", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * rows * n),
      KOKKOS_LAMBDA(const Index i) {
        const Index p = y0 * W + i % n, r = (i / n) % rows, b = i / (n * rows);
        const Index kx = r % K, ky = (r / K) % K, c = r / (K * K);
        const Index y = p / W + ky - P, xx = p % W + kx - P;
        T v = T(0);
        if (xx >= 0 && xx < W) {
          if (y >= 0 && y < H) v = x[b * img + (c * H + y) * W + xx];
          else if (y < 0 && top != nullptr) v = top[b * halo + (c * P + P + y) * W + xx];
          else if (y >= H && bottom != nullptr) v = bottom[b * halo + (c * P + y - H) * W + xx];
        }
        col[(b * rows + r) * pos + p] = v;
      });
}

/// \brief The adjoint of im2col_rows over all h rows: dx (B, C, h, W) (overwritten) gathers the
/// column entries that read each of its elements; dtop and dbottom (B, C, P, W) (overwritten
/// where not null) those that read the halo rows.
template <class T>
void col2im_rows(const ExecSpace& exec, const ConvShape& s, const T* dcol, T* dx, T* dtop, T* dbottom,
                 Index batch) {
  const Index K = s.kernel, P = s.pad, H = s.height, W = s.width, rows = s.rows(), pos = s.positions();
  const Index img = s.channels * H * W, halo = s.channels * P * W, ext = H + 2 * P;
  Kokkos::parallel_for(
      "tessera::col2im_rows",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * s.channels * ext * W),
      KOKKOS_LAMBDA(const Index i) {
        // Row y of the extended block: -P .. h+P-1.
        const Index xx = i % W, y = (i / W) % ext - P, c = (i / (W * ext)) % s.channels, b = i / (W * ext * s.channels);
        T* out = y < 0 ? dtop : y >= H ? dbottom : dx;
        if (out == nullptr) return;
        T sum = T(0);
        for (Index ky = 0; ky < K; ++ky) {
          const Index oy = y - ky + P;
          if (oy < 0 || oy >= H) continue;
          for (Index kx = 0; kx < K; ++kx) {
            const Index ox = xx - kx + P;
            if (ox < 0 || ox >= W) continue;
            sum += dcol[(b * rows + (c * K + ky) * K + kx) * pos + oy * W + ox];
          }
        }
        if (y < 0) out[b * halo + (c * P + P + y) * W + xx] = sum;
        else if (y >= H) out[b * halo + (c * P + y - H) * W + xx] = sum;
        else out[b * img + (c * H + y) * W + xx] = sum;
      });
}

/// \brief out (B, C, n, W) = rows [row0, row0 + n) of every plane of x (B, C, h, W).
template <class T>
void pack_rows(const ExecSpace& exec, const T* x, Index batch, Index channels, Index h, Index W, Index row0,
               Index n, T* out) {
  const Index m = n * W;
  Kokkos::parallel_for(
      "tessera::pack_rows", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * channels * m),
      KOKKOS_LAMBDA(const Index i) {
        const Index plane = i / m, e = i % m;
        out[i] = x[plane * h * W + row0 * W + e];
      });
}

/// \brief Rows [row0, row0 + n) of every plane of x (B, C, h, W) += src (B, C, n, W).
template <class T>
void add_rows(const ExecSpace& exec, const T* src, Index batch, Index channels, Index h, Index W, Index row0,
              Index n, T* x) {
  const Index m = n * W;
  Kokkos::parallel_for(
      "tessera::add_rows", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * channels * m),
      KOKKOS_LAMBDA(const Index i) {
        const Index plane = i / m, e = i % m;
        x[plane * h * W + row0 * W + e] += src[i];
      });
}

/// \brief db[o] += the sum over samples and positions of dz (B, C, P) (a convolution's bias
/// gradient): one thread per channel, samples then positions in order.
template <class T, class DbView>
void channel_sums(const ExecSpace& exec, const T* dz, Index batch, Index channels, Index positions,
                  const DbView& db) {
  Kokkos::parallel_for(
      "tessera::channel_sums", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, channels),
      KOKKOS_LAMBDA(const Index o) {
        T sum = T(0);
        for (Index b = 0; b < batch; ++b)
          for (Index p = 0; p < positions; ++p) sum += dz[(b * channels + o) * positions + p];
        db(o) += sum;
      });
}

/// \brief z (B, C, P) = bias[c] everywhere (before a product adds W col).
template <class T, class BView>
void fill_channels(const ExecSpace& exec, const BView& bias, Index batch, Index channels, Index positions, T* z) {
  Kokkos::parallel_for(
      "tessera::fill_channels",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * channels * positions),
      KOKKOS_LAMBDA(const Index e) { z[e] = bias((e / positions) % channels); });
}

}  // namespace tessera::kernels
