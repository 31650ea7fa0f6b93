#pragma once
// Host 2-D convolutions through oneDNN's convolution primitives: forward with bias, backward
// data, backward weights with the bias gradient, for fp32 NCHW tensors (host pointers), stride
// 1, kernel k x k (odd), columns zero-padded by k/2 on each side ("same" in columns) and rows
// padded by pad_top / pad_bottom zeros: k/2 each is a "same" convolution, 0 each a "valid in
// rows" one over a block whose halo rows are already in place. Used by nn::Cnn and
// nn::FieldConv where blas/conv_library.hpp picks oneDNN; callable directly (tests, benchmarks).
//
// Free of Kokkos and of oneDNN's headers: a build without oneDNN (-DTESSERA_ENABLE_ONEDNN=OFF)
// links onednn_conv_stub.cpp, whose conv_available() is false and whose convolutions throw.
//
// Primitives are created once per (shape, kind, thread count) and kept, with the reorders
// between the callers' NCHW / OIHW buffers and the layouts oneDNN chose (format "any"); the
// reordered copies live in scratch shared by all shapes, grown as needed.
#include <cstddef>
#include <string>

namespace tessera::blas::onednn {

/// A stride-1 convolution of x (batch, in, height, width) into y (batch, out, out_height(),
/// width) with w (out, in, kernel, kernel) and bias (out): NCHW and OIHW as PyTorch's Conv2d.
/// plane_rows_x / plane_rows_y: rows between consecutive (sample, channel) planes of the buffers
/// holding x and y (0: height and out_height(), dense), so a block of rows inside a taller
/// buffer can be read or written in place.
/// bf16: the products in bf16 (train.precision = bf16): x, w and dy read rounded to bf16 (the
/// reorders from the callers' fp32 buffers convert them), sums in fp32, y and dx stored rounded
/// to bf16 (as fp32 values holding them, as the float gemm under bf16 stores its C); the weight
/// and bias gradients are summed and accumulated in fp32.
struct Conv2dShape {
  int batch = 1, in = 1, out = 1, height = 1, width = 1, kernel = 3;
  int pad_top = 1, pad_bottom = 1;  ///< rows of zeros above and below x (columns: kernel/2 each)
  int plane_rows_x = 0, plane_rows_y = 0;
  bool bf16 = false;
  int out_height() const { return height + pad_top + pad_bottom - kernel + 1; }
  /// "Same" in both directions: padding kernel/2 all round.
  static Conv2dShape same(int batch, int in, int out, int height, int width, int kernel, bool bf16 = false) {
    return Conv2dShape{batch, in, out, height, width, kernel, kernel / 2, kernel / 2, 0, 0, bf16};
  }
};

/// \brief True when this build has oneDNN (and so these convolutions).
bool conv_available();

/// \brief y = conv(x, w) + bias (bias may be null: none). Overwrites y's out_height() rows of each
/// plane; other rows of a taller buffer are not touched. Throws std::invalid_argument for a shape
/// that is not a convolution (even or non-positive kernel, negative padding, out_height() < 1,
/// plane rows shorter than the rows they hold) before anything is read.
void conv_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y);

/// \brief dx = the gradient of conv_forward's y with respect to x, for dy (y's shape); overwritten.
void conv_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx);

/// \brief dw += the gradient with respect to w, db += that with respect to the bias (db may be
/// null: skipped), for x and dy: accumulates, so micro-batches may call it in turn.
void conv_backward_weights(const Conv2dShape& s, const float* x, const float* dy, float* dw, float* db);

/// \brief True when oneDNN convolves bf16 natively on this CPU (AVX512-BF16 or AMX); elsewhere its
/// bf16 convolutions are emulated or absent, and Tessera's bf16 convolutions stay on im2col.
bool conv_bf16_native();

/// \brief oneDNN's implementations for s: "fwd <impl>, bwd_d <impl>, bwd_w <impl>"
/// (e.g. "jit:avx512_core"), created (and cached) if needed; "none" without oneDNN.
std::string conv_implementation(const Conv2dShape& s);

/// \brief Convolution primitives created so far (each of the three kinds counts); 0 without oneDNN.
std::size_t conv_cache_size();

}  // namespace tessera::blas::onednn
