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
  const Index H = 2 * h, W = 2 * w, hw = h * w;
  // One output row y of channel c of sample b per r; e walks the input columns, two outputs each.
  for_rows("tessera::upsample2_scatter", exec, batch * channels * H, w, KOKKOS_LAMBDA(const Index r, const Index j) {
    const Index b = r / (channels * H), c = (r / H) % channels, y = r % H;
    const T* src = yp + (b * channels * 4 + c * 4 + (y % 2) * 2) * hw + (y / 2) * w + j;
    T* dst = out + b * out_stride + (c * H + y) * W + 2 * j;
    dst[0] = bias(c) + src[0];
    dst[1] = bias(c) + src[hw];
  });
}

/// \brief dyp (B, C*4, h*w) (overwritten) = the entries of dout (B, C, 2h, 2w) at sample stride
/// out_stride that upsample2_scatter wrote from each.
template <class T>
void upsample2_gather(const ExecSpace& exec, const T* dout, Index out_stride, Index batch, Index channels,
                      Index h, Index w, T* dyp) {
  const Index W = 2 * w;
  // One row i of dyp's plane q = (c, dy, dx) of sample b per r; j walks its columns.
  for_rows("tessera::upsample2_gather", exec, batch * channels * 4 * h, w, KOKKOS_LAMBDA(const Index r, const Index j) {
    const Index b = r / (channels * 4 * h), q = (r / h) % (channels * 4), i = r % h;
    const Index c = q / 4, dy = (q / 2) % 2, dx = q % 2;
    dyp[r * w + j] = dout[b * out_stride + (c * 2 * h + 2 * i + dy) * W + 2 * j + dx];
  });
}

/// \brief dst[b*dst_stride + e] = src[b*src_stride + e] for e < n (add: +=): one sample's
/// channels into (or out of) a concatenation.
template <class T>
void copy_samples(const ExecSpace& exec, const T* src, Index src_stride, T* dst, Index dst_stride, Index batch,
                  Index n, bool add = false) {
  for_rows("tessera::copy_samples", exec, batch, n, KOKKOS_LAMBDA(const Index b, const Index e) {
    const T v = src[b * src_stride + e];
    dst[b * dst_stride + e] = add ? dst[b * dst_stride + e] + v : v;
  });
}

}  // namespace tessera::kernels
