#pragma once
// Convolution over a block of rows of each sample (spatial parallelism: a rank holds rows
// [r0, r0 + h) of every H x W field), by im2col + GEMM as kernels/conv2d.hpp, with the rows
// beyond the block taken from halo buffers its neighbours sent instead of zero padding:
//   x      (B, C, h, W)  this rank's rows
//   top    (B, C, P, W)  rows r0-P .. r0-1 (the rank above's last P rows), or null: zeros
//   bottom (B, C, P, W)  rows r0+h .. r0+h+P-1 (the rank below's first P rows), or null: zeros
// Columns are zero-padded (the block holds whole rows). Deterministic, no atomics:
//   im2col_rows  one thread per (sample, column row, output row) of the rows asked for
//   col2im_rows  one thread per row of x and of the halos, gathering the k*k shifted column rows
//                that read it (the halos' gradients go back to the ranks that own those rows)
//   pack_rows / add_rows  copy P rows of each (sample, channel) plane out, or add them in
#include "kernels/conv2d.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief col (B, C*k*k, h*W) at output rows [y0, y1) only (positions [y0*W, y1*W)):
/// col[b][(c*k + ky)*k + kx][y*W + x] = x[b][c][y + ky - P][x + kx - P], the row from the block,
/// top or bottom, zero outside the field. s.height is the block's rows h, s.pad is P (<= h).
/// One thread per (sample, column row, output row), copying a shifted row of W values.
template <class T>
void im2col_rows(const ExecSpace& exec, const ConvShape& s, const T* x, const T* top, const T* bottom,
                 T* col, Index batch, Index y0, Index y1) {
  const Index K = s.kernel, P = s.pad, H = s.height, W = s.width, rows = s.rows(), pos = s.positions();
  const Index img = s.channels * H * W, halo = s.channels * P * W, ny = y1 - y0;
  if (ny <= 0) return;
  Kokkos::parallel_for(
      "tessera::im2col_rows", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * rows * ny),
      KOKKOS_LAMBDA(const Index i) {
        const Index yo = y0 + i % ny, r = (i / ny) % rows, b = i / (ny * rows);
        const Index kx = r % K, ky = (r / K) % K, c = r / (K * K);
        const Index y = yo + ky - P, shift = kx - P;
        const T* src = nullptr;
        if (y >= 0 && y < H) src = x + b * img + (c * H + y) * W;
        else if (y < 0 && top != nullptr) src = top + b * halo + (c * P + P + y) * W;
        else if (y >= H && bottom != nullptr) src = bottom + b * halo + (c * P + y - H) * W;
        T* dst = col + (b * rows + r) * pos + yo * W;
        if (src == nullptr) {
          for (Index xo = 0; xo < W; ++xo) dst[xo] = T(0);
          return;
        }
        // Output columns whose input column xo + shift lies inside [0, W).
        // (Clamped to [0, W]: a kernel may be wider than the field.)
        const Index lo = -shift < 0 ? 0 : (-shift > W ? W : -shift);
        const Index end = W - shift > W ? W : W - shift, hi = end < lo ? lo : end;
        for (Index xo = 0; xo < lo; ++xo) dst[xo] = T(0);
        for (Index xo = lo; xo < hi; ++xo) dst[xo] = src[xo + shift];
        for (Index xo = hi; xo < W; ++xo) dst[xo] = T(0);
      });
}

/// \brief The adjoint of im2col_rows over all h rows: dx (B, C, h, W) (overwritten) gathers the
/// column entries that read each of its elements; dtop and dbottom (B, C, P, W) (overwritten
/// where not null) those that read the halo rows. One thread per (sample, channel, row of the
/// extended block), summing its k*k shifted column rows in a fixed order.
template <class T>
void col2im_rows(const ExecSpace& exec, const ConvShape& s, const T* dcol, T* dx, T* dtop, T* dbottom,
                 Index batch) {
  const Index K = s.kernel, P = s.pad, H = s.height, W = s.width, rows = s.rows(), pos = s.positions();
  const Index img = s.channels * H * W, halo = s.channels * P * W, ext = H + 2 * P;
  Kokkos::parallel_for(
      "tessera::col2im_rows",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * s.channels * ext),
      KOKKOS_LAMBDA(const Index i) {
        // Row y of the extended block: -P .. h+P-1.
        const Index y = i % ext - P, c = (i / ext) % s.channels, b = i / (ext * s.channels);
        T* out = nullptr;
        if (y < 0) out = dtop == nullptr ? nullptr : dtop + b * halo + (c * P + P + y) * W;
        else if (y >= H) out = dbottom == nullptr ? nullptr : dbottom + b * halo + (c * P + y - H) * W;
        else out = dx + b * img + (c * H + y) * W;
        if (out == nullptr) return;
        for (Index xx = 0; xx < W; ++xx) out[xx] = T(0);
        for (Index ky = 0; ky < K; ++ky) {
          const Index oy = y - ky + P;
          if (oy < 0 || oy >= H) continue;
          for (Index kx = 0; kx < K; ++kx) {
            // out[xx] += dcol[r][oy*W + xx - shift] where that output column lies in [0, W).
            const Index shift = kx - P;
            const T* src = dcol + (b * rows + (c * K + ky) * K + kx) * pos + oy * W;
            const Index lo = shift < 0 ? 0 : (shift > W ? W : shift);
            const Index end = W + shift < W ? W + shift : W, hi = end < lo ? lo : end;
            for (Index xx = lo; xx < hi; ++xx) out[xx] += src[xx - shift];
          }
        }
      });
}

/// \brief out (B, C, n, W) = rows [row0, row0 + n) of every plane of x (B, C, h, W).
template <class T>
void pack_rows(const ExecSpace& exec, const T* x, Index batch, Index channels, Index h, Index W, Index row0,
               Index n, T* out) {
  const Index m = n * W;
  for_rows("tessera::pack_rows", exec, batch * channels, m, KOKKOS_LAMBDA(const Index plane, const Index e) {
    out[plane * m + e] = x[plane * h * W + row0 * W + e];
  });
}

/// \brief Rows [row0, row0 + n) of every plane of x (B, C, h, W) = src (B, C, n, W), or zeros where
/// src is null (the inverse of pack_rows).
template <class T>
void place_rows(const ExecSpace& exec, const T* src, Index batch, Index channels, Index h, Index W, Index row0,
                Index n, T* x) {
  const Index m = n * W;
  for_rows("tessera::place_rows", exec, batch * channels, m, KOKKOS_LAMBDA(const Index plane, const Index e) {
    x[plane * h * W + row0 * W + e] = src == nullptr ? T(0) : src[plane * m + e];
  });
}

/// \brief Rows [row0, row0 + n) of every plane of x (B, C, h, W) += src (B, C, n, W).
template <class T>
void add_rows(const ExecSpace& exec, const T* src, Index batch, Index channels, Index h, Index W, Index row0,
              Index n, T* x) {
  const Index m = n * W;
  for_rows("tessera::add_rows", exec, batch * channels, m, KOKKOS_LAMBDA(const Index plane, const Index e) {
    x[plane * h * W + row0 * W + e] += src[plane * m + e];
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
