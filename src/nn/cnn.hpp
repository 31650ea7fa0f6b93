#pragma once
// A convolutional classifier: blocks of (conv k x k, zero padding k/2, stride 1) + ReLU + 2x2
// max-pool, one per entry of `channels`, then the flattened features through linear layers with
// ReLU between (the MLP's layers: `hidden`, then the classes).
//
// Parameters (PyTorch's layouts): convs.{i}.weight [out_c, in_c, k, k], convs.{i}.bias [out_c],
// fc.{j}.weight [out, in], fc.{j}.bias [out]. One unit per layer (hooks, ZeRO, buckets).
//
// Convolutions run as im2col + one GEMM per sample (kernels/conv2d.hpp; the column matrices are
// kept for the weight gradient) or, for float models in host memory where run.conv picks it
// (blas/conv_library.hpp), through oneDNN's convolution primitives (blas/onednn_conv.hpp; each
// block's input is kept for the weight gradient instead). Tensor parallelism splits the linear layers as the MLP does
// (Megatron column/row pairs); the convolutions are replicated on the tensor ranks. The whole
// model sits on one pipeline stage.
#include <cstdint>
#include <functional>
#include <vector>

#include "core/conv_library.hpp"
#include "core/precision.hpp"
#include "kernels/conv2d.hpp"
#include "nn/linear.hpp"
#include "nn/network.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

struct CnnShape {
  int channels = 1, height = 28, width = 28;  ///< the input image
  std::vector<int> conv;                      ///< output channels of each block
  int kernel = 3;
  std::vector<int> hidden;                    ///< linear layers after the convolutions
  int classes = 10;
};

template <class T>
class Cnn : public Network<T> {
 public:
  struct Part {
    int tp = 1, t = 0;
    std::function<void(T*, std::size_t)> tensor_sum;
    ConvLibrary conv = ConvLibrary::automatic;  ///< run.conv
    Precision precision = Precision::fp32;      ///< train.precision: of every product and convolution
                                                ///< (fp16: im2col; bf16: blas::conv_path)
  };

  /// \brief Registers the parameters in `store` (before store.plan()); throws
  /// std::invalid_argument when the image vanishes under the pools or the kernel is even.
  Cnn(ParamStore<T>& store, const CnnShape& shape, Part part = {});

  bool first_stage() const override { return true; }
  bool last_stage() const override { return true; }
  int input_width() const override { return shape_.channels * shape_.height * shape_.width; }
  int output_width() const override { return fcs_.back().out_features(); }
  /// \brief Bytes add_slot() allocates: `slots` slots of `max_batch` rows each plus backward's
  /// scratch the first slot makes for all (slots = 0: the scratch alone).
  double activation_bytes(int max_batch, int slots) const override;

  MatrixU<T> input(int slot) const override;
  MatrixU<T> output(int slot) const override;
  MatrixU<T> grad_output(int slot) const override;
  MatrixU<T> grad_input(int slot) const override;
  void forward(const ExecSpace& exec, int slot) override;
  void backward(const ExecSpace& exec, int slot) override;
  /// True when the convolutions run through oneDNN (run.conv's choice for this T and precision).
  bool onednn() const { return onednn_; }

 protected:
  void add_slot() override;
  void clear_slots() override;

 private:
  struct Conv {
    kernels::ConvShape in;  // the block's input image and kernel
    int out = 0;            // output channels
    std::size_t weight = 0, bias = 0, unit = 0;
  };
  struct Slot {
    Matrix<T> input;
    std::vector<Matrix<T>> col, z, pooled;        // per conv block (col: im2col only)
    std::vector<Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemSpace>> arg;
    std::vector<Matrix<T>> fz, fa, fg;            // per linear layer
  };
  /// z (B, out, H, W) = bias + conv(x) of block i; keeps what the weight gradient needs.
  void conv_forward(const ExecSpace& exec, std::size_t i, int batch, const T* x, const Slot& s) const;
  /// dW, db += the gradients of block i from dz_ (B, out, H, W); dpool_ = the input gradient
  /// (i > 0 only).
  void conv_backward(const ExecSpace& exec, std::size_t i, int batch, const Slot& s);

  using Network<T>::rows;
  using Network<T>::hooks_;

  CnnShape shape_;
  Part part_;
  ParamStore<T>* store_;
  std::vector<Conv> convs_;
  std::vector<Linear<T>> fcs_;
  std::vector<Slot> slots_;
  bool onednn_ = false;
  Matrix<T> dz_, dcol_, dpool_;  // backward scratch, shared
};

extern template class Cnn<float>;
extern template class Cnn<double>;

}  // namespace tessera::nn
