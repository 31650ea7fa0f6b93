#pragma once
// 2-D convolution by im2col + GEMM, and 2x2 max-pooling, over samples stored as rows of
// C*H*W floats (CHW order). Stride 1, zero padding p, square kernel k (the caller chooses p =
// k/2 for "same" output). Deterministic and without atomics:
//   im2col  one thread per (sample, column row, output position)
//   col2im  one thread per input element, gathering the k*k positions that read it
//   max-pool forward one thread per output (saving the argmax), backward one thread per output
//            scattering into its own window (windows do not overlap)
#include <cstdint>

#include "kernels/views.hpp"

namespace tessera::kernels {

struct ConvShape {
  Index channels = 1, height = 1, width = 1, kernel = 3, pad = 1;
  Index rows() const { return channels * kernel * kernel; }  ///< rows of one sample's column matrix
  Index positions() const { return height * width; }          ///< output positions ("same" size)
};

/// \brief col (B, C*k*k, H*W) from x (B, C*H*W): col[b][(c*k + ky)*k + kx][y*W + x] =
/// x[b][c][y + ky - p][x + kx - p], zero outside the image.
template <class T>
void im2col(const ExecSpace& exec, const ConvShape& s, const T* x, T* col, Index batch) {
  const Index K = s.kernel, P = s.pad, H = s.height, W = s.width, rows = s.rows(), pos = s.positions();
  const Index img = s.channels * H * W;
  Kokkos::parallel_for(
      "tessera::im2col", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * rows * pos),
      KOKKOS_LAMBDA(const Index i) {
        const Index p = i % pos, r = (i / pos) % rows, b = i / (pos * rows);
        const Index kx = r % K, ky = (r / K) % K, c = r / (K * K);
        const Index y = p / W + ky - P, xx = p % W + kx - P;
        col[i] = y >= 0 && y < H && xx >= 0 && xx < W ? x[b * img + (c * H + y) * W + xx] : T(0);
      });
}

/// \brief dx (B, C*H*W) = the adjoint of im2col applied to dcol (B, C*k*k, H*W) (overwritten).
template <class T>
void col2im(const ExecSpace& exec, const ConvShape& s, const T* dcol, T* dx, Index batch) {
  const Index K = s.kernel, P = s.pad, H = s.height, W = s.width, rows = s.rows(), pos = s.positions();
  const Index img = s.channels * H * W;
  Kokkos::parallel_for(
      "tessera::col2im", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * img),
      KOKKOS_LAMBDA(const Index i) {
        const Index b = i / img, e = i % img, c = e / (H * W), y = (e / W) % H, xx = e % W;
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
        dx[i] = sum;
      });
}

/// \brief 2x2 max-pool, stride 2 (odd trailing rows/columns dropped): y (B, C*(H/2)*(W/2)) from
/// x (B, C*H*W), arg = the index within the sample of each maximum (the first on ties).
template <class T>
void maxpool2_forward(const ExecSpace& exec, Index batch, Index channels, Index H, Index W, const T* x,
                      T* y, std::int32_t* arg) {
  const Index h = H / 2, w = W / 2, img = channels * H * W;
  // One output row oy of channel c of sample b per r (r = (b C + c) h + oy); ox along it.
  for_rows("tessera::maxpool2_forward", exec, batch * channels * h, w, KOKKOS_LAMBDA(const Index r, const Index ox) {
    const Index b = r / (channels * h), c = (r / h) % channels, oy = r % h, i = r * w + ox;
    Index best = (c * H + 2 * oy) * W + 2 * ox;
    for (Index dy = 0; dy < 2; ++dy)
      for (Index dx = 0; dx < 2; ++dx) {
        const Index j = (c * H + 2 * oy + dy) * W + 2 * ox + dx;
        if (x[b * img + j] > x[b * img + best]) best = j;
      }
    y[i] = x[b * img + best];
    arg[i] = std::int32_t(best);
  });
}

/// \brief dx (B, C*H*W) (overwritten) from dy of maxpool2_forward and its argmax.
template <class T>
void maxpool2_backward(const ExecSpace& exec, Index batch, Index channels, Index H, Index W, const T* dy,
                       const std::int32_t* arg, T* dx) {
  const Index h = H / 2, w = W / 2, img = channels * H * W;
  for_rows("tessera::maxpool2_backward", exec, batch * channels * h, w, KOKKOS_LAMBDA(const Index r, const Index ox) {
    const Index b = r / (channels * h), c = (r / h) % channels, oy = r % h, i = r * w + ox;
    // This output's window, zero but for its maximum (windows do not overlap; inputs in
    // no window, the odd trailing ones, are zeroed by the caller).
    for (Index ry = 0; ry < 2; ++ry)
      for (Index rx = 0; rx < 2; ++rx) {
        const Index j = (c * H + 2 * oy + ry) * W + 2 * ox + rx;
        dx[b * img + j] = j == Index(arg[i]) ? dy[i] : T(0);
      }
  });
}

}  // namespace tessera::kernels
