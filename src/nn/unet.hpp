#pragma once
// A fully convolutional U-Net for field-to-field regression (model.kind = "unet"), e.g. the
// permeability of a Darcy problem to its pressure (tessera prepare darcy). With levels
// c_0 .. c_{L-1} (model.channels):
//
//   down.l:  x -> act(conv1(x)) -> act(conv2(.)) = s_l     k x k "same" convolutions
//            x_{l+1} = maxpool2(s_l)                         (l < L-1; level L-1 is the bottom)
//   up.l:    u = upconv(x) (2x2, stride 2: c_{l+1} -> c_l)   (l = L-2 .. 0)
//            x = act(conv2(act(conv1([u, s_l]))))            the skip connection: channels u, then s_l
//   head:    1x1 convolution c_0 -> output channels; the loss is the mean squared error over
//            every value of each field, and evaluation reports the relative L2 error
//            ||prediction - target|| / ||target|| per sample
//
// With UNetShape::norm the input is standardised per channel before down.0 and the head's output
// mapped back to the targets' units; the loss is then the mean squared error of the standardised
// fields (FieldNorm).
//
// act is model.activation (ReLU or GELU). Parameters as PyTorch's modules:
// down.{l}.conv{1,2}.weight [out, in, k, k] (nn.Conv2d), up.{l}.upconv.weight [c_{l+1}, c_l, 2, 2]
// (nn.ConvTranspose2d), up.{l}.conv{1,2}, head.weight [out, c_0, 1, 1]; biases [out]. A unit per
// layer, in forward order.
//
// Spatial parallelism (parallel.spatial = S): this rank holds rows [r H/S, (r+1) H/S) of every
// field and activation (a block of rows of each level). Convolutions exchange halos with the
// neighbouring blocks (nn::FieldConv, nn::Halo); pooling and up-sampling never cross a block
// (each block's rows at every level are even, checked by the deck); the loss's per-sample sums
// are summed over the spatial group. Buffers hold one row per sample: (B, C * rows * W).
#include <cstdint>
#include <memory>
#include <vector>

#include "core/config.hpp"
#include "kernels/views.hpp"
#include "nn/field_conv.hpp"
#include "nn/halo.hpp"
#include "nn/network.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

/// Standardisation of the fields (data.normalize), per channel: the network sees
/// (x_c - in_mean_c) / in_std_c, and its last layer's output h_c stands for
/// (u_c - out_mean_c) / out_std_c, so output() = out_std_c h_c + out_mean_c is in the targets'
/// units. The loss is then the mean squared error of the standardised fields, the relative L2
/// error that of the fields themselves. Empty vectors: none (the identity).
struct FieldNorm {
  std::vector<double> in_mean, in_std, out_mean, out_std;
  bool empty() const { return in_mean.empty(); }
};

struct UNetShape {
  int in_channels = 1, out_channels = 1;
  int height = 1;       ///< this rank's rows of each field (H / spatial ranks)
  int width = 1;        ///< W
  int field_height = 1; ///< H: the loss's mean runs over out_channels * H * W values per sample
  std::vector<int> levels = {16, 32};  ///< channels per level, finest first
  int kernel = 3;
  Activation activation = Activation::relu;
  FieldNorm norm;  ///< sizes in_channels and out_channels, or empty
};

template <class T>
class UNet : public Network<T> {
 public:
  struct Part {
    std::shared_ptr<Halo<T>> halo;  ///< the spatial neighbours; null: this rank holds whole fields
    bool overlap = true;            ///< compute interior rows while a halo is in flight
    ConvLibrary conv = ConvLibrary::automatic;  ///< run.conv (float only; blas/conv_library.hpp)
    Precision precision = Precision::fp32;      ///< train.precision: of every product and convolution
                                                ///< (fp16: im2col; bf16: blas::conv_path)
  };

  /// \brief Registers the parameters in `store` (before store.plan()); throws
  /// std::invalid_argument where a level's block of rows is odd or thinner than the halo.
  UNet(ParamStore<T>& store, const UNetShape& shape, Part part = {});

  bool first_stage() const override { return true; }
  bool last_stage() const override { return true; }
  int input_width() const override { return shape_.in_channels * shape_.height * shape_.width; }
  int output_width() const override { return shape_.out_channels * shape_.height * shape_.width; }
  double activation_bytes(int max_batch, int slots) const override;

  MatrixU<T> input(int slot) const override;
  MatrixU<T> output(int slot) const override;
  MatrixU<T> grad_output(int slot) const override;
  MatrixU<T> grad_input(int slot) const override;
  void forward(const ExecSpace& exec, int slot) override;
  void backward(const ExecSpace& exec, int slot) override;
  /// \brief The mean squared error over each whole field (this block's part of it, its sums over
  /// the spatial group), counted on spatial rank 0: loss = sum over samples of the mean (of the
  /// standardised fields under FieldNorm), rel_l2 = sum over samples of the relative L2 error.
  /// Targets (B, output_width), in their own units; labels unused.
  LossSums loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t> labels, MatrixU<const T> targets,
                T scale) override;

 protected:
  void add_slot() override;
  void clear_slots() override;

 private:
  struct Up {  // a decoder level
    std::size_t weight = 0, bias = 0, unit = 0;  // the 2x2 up-sampling
    int in = 0, out = 0, rows = 0, width = 0;    // its input: in channels, rows x width (half the level's)
    std::size_t conv1 = 0, conv2 = 0;            // indices in convs_
  };
  struct Slot {
    Matrix<T> input, std_input, out, gout;  // std_input: the standardised input (FieldNorm)
    std::vector<Matrix<T>> col, z, a;  // per convolution
    std::vector<Matrix<T>> pooled, cat;  // per level but the bottom
    std::vector<Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemSpace>> arg;
  };
  using Network<T>::rows;
  using Network<T>::hooks_;

  /// conv i: before/after hooks, convolution, activation (z -> a).
  void run_conv(const ExecSpace& exec, std::size_t i, Index batch, const T* x, Slot& s);
  /// Back through conv i's activation and convolution: g (dz of its output, in place) -> dx.
  void back_conv(const ExecSpace& exec, std::size_t i, Index batch, T* g, T* dx, Slot& s);
  void up_forward(const ExecSpace& exec, std::size_t l, Index batch, const T* x, Slot& s);
  void up_backward(const ExecSpace& exec, std::size_t l, Index batch, const T* x, const T* dcat, T* dx);
  void head_forward(const ExecSpace& exec, Index batch, const T* x, T* out);
  void head_backward(const ExecSpace& exec, Index batch, const T* x, const T* g, T* dx);
  Index level_rows(std::size_t l) const { return Index(shape_.height) >> l; }
  Index level_width(std::size_t l) const { return Index(shape_.width) >> l; }
  Index level_size(std::size_t l) const { return Index(shape_.levels[l]) * level_rows(l) * level_width(l); }
  /// Per-sample elements of the largest activation or gradient, column matrix and halo.
  Index largest_activation() const;
  Index largest_col() const;
  Index largest_halo() const;
  HaloBuffers<T> halo_buffers() const;

  UNetShape shape_;
  Part part_;
  ParamStore<T>* store_;
  std::vector<FieldConv<T>> convs_;  // down.0.conv1, down.0.conv2, ..., then each up level's two
  std::vector<Up> ups_;              // by level l = 0 .. L-2
  std::size_t head_weight_ = 0, head_bias_ = 0, head_unit_ = 0;
  std::vector<Slot> slots_;
  // Shared by the slots (one forward or backward at a time).
  Matrix<T> ga_, gb_, yp_, dcol_, halo_;
  std::vector<Matrix<T>> dskip_;
  Kokkos::View<double**, Kokkos::LayoutRight, MemSpace> sums_;
  // FieldNorm as factors: in_scale = 1/in_std, in_shift = -in_mean/in_std, out_std, out_mean,
  // out_inv = 1/out_std (identity without one).
  Vector<T> in_scale_, in_shift_, out_std_, out_mean_, out_inv_;
};

extern template class UNet<float>;
extern template class UNet<double>;

}  // namespace tessera::nn
