#pragma once
// 2x2 up-sampling by a transposed convolution of kernel 2 and stride 2 (PyTorch's
// ConvTranspose2d(in, out, 2, stride=2)): each input pixel (i, j) becomes the 2x2 block
// (2i + dy, 2j + dx) of the output, out[o][2i+dy][2j+dx] = b[o] + sum_c w[c][o][dy][dx] x[c][i][j].
// The product runs as one GEMM per sample, yp (out*4, h*w) = w^T x, whose rows these kernels
// scatter into the output image (and gather back for the gradient). Pixels never mix, so a
// block of rows maps to a block of twice as many rows: spatial blocks need no halo here.
// Also the per-sample strided copies of a channel concatenation (the U-Net's skip connections).
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief out (B, C, 2h, 2w) at sample stride out_stride = b[c] + yp (B, C*4, h*w), rows of yp
/// ordered (c, dy, dx).
template <class T, class BView>
void upsample2_scatter(const ExecSpace& exec, const T* yp, const BView& bias, Index batch, Index channels,
                       Index h, Index w, T* out, Index out_stride) {
  const Index H = 2 * h, W = 2 * w, img = channels * H * W, hw = h * w;
  Kokkos::parallel_for(
      "tessera::upsample2_scatter", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * img),
      KOKKOS_LAMBDA(const Index e) {
        const Index b = e / img, r = e % img, c = r / (H * W), y = (r / W) % H, x = r % W;
        const Index q = c * 4 + (y % 2) * 2 + x % 2;
        out[b * out_stride + r] = bias(c) + yp[(b * channels * 4 + q) * hw + (y / 2) * w + x / 2];
      });
}

/// \brief dyp (B, C*4, h*w) (overwritten) = the entries of dout (B, C, 2h, 2w) at sample stride
/// out_stride that upsample2_scatter wrote from each.
template <class T>
void upsample2_gather(const ExecSpace& exec, const T* dout, Index out_stride, Index batch, Index channels,
                      Index h, Index w, T* dyp) {
  const Index W = 2 * w, hw = h * w, n = channels * 4 * hw;
  Kokkos::parallel_for(
      "tessera::upsample2_gather", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * n),
      KOKKOS_LAMBDA(const Index e) {
        const Index b = e / n, q = (e / hw) % (channels * 4), p = e % hw;
        const Index c = q / 4, dy = (q / 2) % 2, dx = q % 2, i = p / w, j = p % w;
        dyp[e] = dout[b * out_stride + (c * 2 * h + 2 * i + dy) * W + 2 * j + dx];
      });
}

/// \brief dst[b*dst_stride + e] = src[b*src_stride + e] for e < n (add: +=): one sample's
/// channels into (or out of) a concatenation.
template <class T>
void copy_samples(const ExecSpace& exec, const T* src, Index src_stride, T* dst, Index dst_stride, Index batch,
                  Index n, bool add = false) {
  Kokkos::parallel_for(
      "tessera::copy_samples", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, batch * n),
      KOKKOS_LAMBDA(const Index i) {
        const Index b = i / n, e = i % n;
        const T v = src[b * src_stride + e];
        dst[b * dst_stride + e] = add ? dst[b * dst_stride + e] + v : v;
      });
}

}  // namespace tessera::kernels
