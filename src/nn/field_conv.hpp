#pragma once
// A k x k "same" convolution (stride 1, zero padding k/2 at the field's edges) over this rank's
// block of rows of each sample: the U-Net's convolution under spatial parallelism.
//
// Forward: pack the block's first and last P = k/2 rows and start their exchange with the
// neighbours (nn::Halo), build the columns of the interior output rows (those that read no halo)
// and multiply them while the halo is in flight, then wait, build the boundary rows' columns
// from the halos and multiply those. Backward: dcol = W^T dz and col2im give the gradient of the
// block's rows and of the halo rows, whose gradients go back to the ranks that own them; the
// weight gradient dW += dz col^T is computed while they travel; what the neighbours send back is
// added to the block's first and last rows. With one rank (or no halo) the edges are zeros, as
// PyTorch's Conv2d(padding=k//2).
//
// Through oneDNN (Shape::onednn, float only: blas/onednn_conv.hpp) the same steps run as
// convolutions "valid in rows, same in columns": forward copies the block into the middle of an
// extended block (B, in, rows + 2P, W) kept in col's place, computes the interior output rows from
// the block itself while the halo travels, then places the halos (zeros at the field's edges) above
// and below and computes the boundary rows from the extended block; backward gives the extended
// block's gradient (the block's rows and the halo rows), sends the halo rows' parts, and computes
// the weight and bias gradients from the extended block while they travel. Where no halo is
// exchanged (one rank) the forward and the input gradient are "same" convolutions of the block
// itself, and where none is in flight (overlap off) the forward is one convolution of the
// extended block.
//
// Parameters as nn.Conv2d: <prefix>.weight [out, in, k, k], <prefix>.bias [out], initialised
// U(-1/sqrt(in k^2), 1/sqrt(in k^2)); a unit of their own.
#include <string>

#include "core/precision.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/views.hpp"
#include "nn/halo.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

/// Scratch of a halo exchange: each buffer holds batch * halo_size() values.
template <class T>
struct HaloBuffers {
  T* send_up = nullptr;
  T* send_down = nullptr;
  T* recv_up = nullptr;
  T* recv_down = nullptr;
};

template <class T>
class FieldConv {
 public:
  struct Shape {
    int in = 1, out = 1, kernel = 3;
    int rows = 1, width = 1;  ///< this rank's block of the field: rows x width
    bool onednn = false;      ///< through oneDNN's convolutions (T = float; blas/conv_library.hpp chooses)
    /// Of the products (blas::matmul) and, through oneDNN, of the convolutions (bf16:
    /// Conv2dShape::bf16): train.precision.
    Precision precision = Precision::fp32;
  };

  /// \brief Registers the parameters in `store` as a new unit; throws std::invalid_argument for
  /// an even kernel or a block of fewer rows than the halo (k/2).
  FieldConv(ParamStore<T>& store, const std::string& prefix, const Shape& shape);

  const Shape& shape() const { return s_; }
  std::size_t unit() const { return unit_; }
  int pad() const { return s_.kernel / 2; }
  /// Per sample: values of the input block, of the output block, of the column matrix (oneDNN:
  /// of the extended block, which it holds in col's place), of one halo.
  Index in_size() const { return Index(s_.in) * s_.rows * s_.width; }
  Index out_size() const { return Index(s_.out) * s_.rows * s_.width; }
  Index col_size() const { return conv_.rows() * conv_.positions(); }
  Index halo_size() const { return Index(s_.in) * pad() * s_.width; }

  /// \brief z (B, out, rows, W) = bias + conv(x), x (B, in, rows, W); col (B, col_size) is kept
  /// for backward. halo null (or of one rank): zeros beyond the block. overlap false: wait for
  /// the halo before computing anything. Reads the parameters (between the unit's hooks).
  void forward(const ExecSpace& exec, Index batch, const T* x, T* col, T* z, const HaloBuffers<T>& buf,
               Halo<T>* halo, bool overlap) const;
  /// \brief dW, db += the gradients of dz (B, out, rows, W); dx (B, in, rows, W) = the input
  /// gradient, halo rows' parts exchanged and added (skipped where dx is null: the first layer).
  /// dcol: scratch of batch * col_size().
  void backward(const ExecSpace& exec, Index batch, const T* dz, const T* col, T* dx, T* dcol,
                const HaloBuffers<T>& buf, Halo<T>* halo, bool overlap) const;

 private:
  /// z[:, :, y0:y1, :] += W col[:, :, y0:y1 positions], sample by sample.
  void multiply_rows(const ExecSpace& exec, Index batch, const T* col, T* z, Index y0, Index y1) const;
  /// The oneDNN forms of forward and backward (ext: the extended block, in col's place).
  void forward_onednn(const ExecSpace& exec, Index batch, const T* x, T* ext, T* z, const HaloBuffers<T>& buf,
                      Halo<T>* halo, bool exchange, bool overlap) const;
  void backward_onednn(const ExecSpace& exec, Index batch, const T* dz, const T* ext, T* dx, T* dext,
                       const HaloBuffers<T>& buf, Halo<T>* halo, bool exchange, bool overlap) const;
  /// oneDNN's convolutions in bf16 (Conv2dShape::bf16).
  bool bf16() const { return s_.precision == Precision::bf16; }

  ParamStore<T>* store_;
  Shape s_;
  kernels::ConvShape conv_;
  std::size_t weight_ = 0, bias_ = 0, unit_ = 0;
};

extern template class FieldConv<float>;
extern template class FieldConv<double>;

}  // namespace tessera::nn
